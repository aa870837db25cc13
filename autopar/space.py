"""The candidate space: each axis's domain, and pruned grids over a few axes.

Domains come from the products (an axis of ``tp*pp*cp*dp == N`` divides ``N``) and the options
(allowed modes, ``max_mbs``, ``max_vpp``). ``pruned_grid`` enumerates the Cartesian product of a few
axes and keeps the rows that every rule over those axes allows and whose partial products divide
their totals, so cost-term tables stay small even at 100k GPUs (DESIGN §3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from autopar.plan import GRID_AXES
from autopar.rules import Product, Rule, layout_rules, products
from autopar.specs import RECOMPUTE_MODES, Problem


def divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


DERIVED: dict[str, tuple[str, ...]] = {
    # dp follows from the GPU count, grad_accum from the batch (the two products).
    "dp": ("tp", "pp", "cp"),
    "grad_accum": ("mbs", "dp"),
}


@dataclass(frozen=True, slots=True)
class Space:
    domains: dict[str, tuple[int, ...]]
    rules: tuple[Rule, ...]
    products: tuple[Product, ...]

    def free_axes(self, axes: Iterable[str]) -> tuple[str, ...]:
        """The axes that determine ``axes``: ``grad_accum`` is replaced by ``mbs, dp`` and ``dp``
        by ``tp, pp, cp``, since the two products fix them."""
        need = set(axes)
        for derived in ("grad_accum", "dp"):
            if derived in need:
                need = (need - {derived}) | set(DERIVED[derived])
        return tuple(a for a in GRID_AXES if a in need)

    def key_axes(self, axes: Iterable[str]) -> tuple[str, ...]:
        """``free_axes`` less the constants (axes with one allowed value): a table's columns."""
        return tuple(a for a in self.free_axes(axes) if len(self.domains[a]) > 1)

    def pruned_grid(self, axes: Iterable[str]) -> dict[str, np.ndarray]:
        """Rows over the free axes of ``axes`` (with the derived ``dp`` / ``grad_accum`` columns)
        that every rule over those axes allows and that satisfy the products (DESIGN §3).

        Built as a join, one axis at a time, filtering as soon as a rule's axes are all present,
        so the unpruned Cartesian product is never materialised.
        """
        axes = tuple(dict.fromkeys(axes))
        derive = {"dp"} & set(axes) | ({"dp", "grad_accum"} if "grad_accum" in axes else set())
        grid: dict[str, np.ndarray] = {}
        applied: set[int] = set()
        size = 1
        for axis in self.free_axes(axes):
            values = np.array(self.domains[axis], dtype=np.int64)
            grid = {a: np.repeat(v, len(values)) for a, v in grid.items()}
            grid[axis] = np.tile(values, size)
            grid = self._derive(grid, derive)
            grid = self._filter(grid, applied)
            size = len(grid[axis])
        return grid

    def _derive(self, grid: dict[str, np.ndarray], derive: set[str]) -> dict[str, np.ndarray]:
        """Add ``dp`` (from tp, pp, cp) and ``grad_accum`` (from mbs, dp) once they follow."""
        gpus, batch = self.products[0].total, self.products[1].total
        if "dp" in derive and "dp" not in grid and {"tp", "pp", "cp"} <= set(grid):
            model_parallel = grid["tp"] * grid["pp"] * grid["cp"]
            ok = gpus % model_parallel == 0
            dp = gpus // np.where(ok, model_parallel, 1)
            grid = _rows_where(grid, ok & np.isin(dp, self.domains["dp"]))
            grid["dp"] = gpus // (grid["tp"] * grid["pp"] * grid["cp"])
        if "grad_accum" in derive and "grad_accum" not in grid and {"mbs", "dp"} <= set(grid):
            per_step = grid["mbs"] * grid["dp"]
            ok = batch % per_step == 0
            accum = batch // np.where(ok, per_step, 1)
            grid = _rows_where(grid, ok & np.isin(accum, self.domains["grad_accum"]))
            grid["grad_accum"] = batch // (grid["mbs"] * grid["dp"])
        return grid

    def _filter(self, grid: dict[str, np.ndarray], applied: set[int]) -> dict[str, np.ndarray]:
        """Apply the rules that just became complete, and the products' partial divisibility."""
        present = set(grid)
        keep = np.ones(len(next(iter(grid.values()))), dtype=bool)
        for i, rule in enumerate(self.rules):
            if i not in applied and set(rule.axes) <= present:
                keep &= rule.check(grid)
                applied.add(i)
        for product in self.products:
            inside = [a for a in product.axes if a in present]
            if len(inside) > 1:
                keep &= product.total % np.prod([grid[a] for a in inside], axis=0) == 0
        return _rows_where(grid, keep)


def _rows_where(grid: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    return {a: v[keep] for a, v in grid.items()}


def _axis_domains(problem: Problem) -> dict[str, tuple[int, ...]]:
    training, options, model = problem.training, problem.options, problem.model
    gpu_divisors = divisors(training.num_gpus)
    batch_divisors = divisors(training.global_batch_sequences)
    expert_divisors = divisors(model.num_experts) if model.is_moe else (1,)
    return {
        "tp": gpu_divisors,
        "pp": tuple(d for d in gpu_divisors if d <= model.num_layers),
        "cp": gpu_divisors,
        "dp": gpu_divisors,
        "ep": tuple(d for d in expert_divisors if training.num_gpus % d == 0),
        "etp": tuple(d for d in gpu_divisors if d <= problem.cluster.gpus_per_node)
        if model.is_moe
        else (1,),
        "vpp": tuple(range(1, options.max_vpp + 1)),
        "mbs": tuple(d for d in batch_divisors if d <= options.max_mbs),
        "grad_accum": batch_divisors,
        "recompute": tuple(sorted(RECOMPUTE_MODES.index(m) for m in options.recompute)),
        "zero": tuple(sorted(options.zero_stages)),
        "sp": (0, 1),
    }


def build_space(problem: Problem, *, prune: bool = True) -> Space:
    """The space of ``problem``; with ``prune`` the single-axis rules shrink the domains."""
    rules = layout_rules(problem)
    domains = _axis_domains(problem)
    if prune:
        for rule in rules:
            if len(rule.axes) == 1:
                axis = rule.axes[0]
                values = np.array(domains[axis], dtype=np.int64)
                domains[axis] = tuple(int(v) for v in values[rule.check({axis: values})])
        rules = tuple(rule for rule in rules if len(rule.axes) > 1)
    return Space(domains=domains, rules=rules, products=products(problem))


def iter_layout_rows(space: Space) -> Iterable[dict[str, int]]:
    """Every full assignment allowed by the rules and products (the brute-force oracle's space)."""
    grid = space.pruned_grid(GRID_AXES)
    for i in range(len(grid["tp"])):
        yield {a: int(grid[a][i]) for a in GRID_AXES}
