"""The candidate space of a problem: each axis's domain, the two products, the rules, and pruned
grids over a few axes.

Domains come from the axes table (``autopar.base.axes``: an axis of ``tp*pp*cp*dp == num_gpus``
divides ``num_gpus``; allowed modes; the caps of ``vpp`` and ``mbs``). ``pruned_grid`` enumerates
the Cartesian product of a few axes and keeps the rows that every rule over those axes allows and
whose partial products divide their totals, so cost-term tables stay small even at 100k GPUs
(DESIGN §3). A ``Space`` is built once per problem and carried to the CP-SAT model, the
explanation and ``evaluate``'s layout check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from autopar.base.axes import AXES, AXIS, GRID_AXES, PRODUCTS
from autopar.base.errors import InputError
from autopar.inputs.specs import Problem
from autopar.layout.rules import Rule, layout_rules


@dataclass(frozen=True, slots=True, kw_only=True)
class Product:
    """``prod(axes) == total``: one of the two product rules (DESIGN §2)."""

    family: str
    text: str
    axes: tuple[str, ...]
    total: int
    source: str


PRODUCT_SOURCES: dict[str, tuple[str, str]] = {
    "dp": ("GPU count", "Megatron initialize_model_parallel (parallel_state.py)"),
    "grad_accum": ("global batch", "Megatron num_microbatches_calculator.py"),
}
"""Each product rule's family and source, by the axis it derives (``PRODUCTS``)."""


def products(problem: Problem) -> tuple[Product, ...]:
    """The GPU-count and global-batch products (``autopar.base.axes.PRODUCTS``: the axes of
    each follow from ``Axis.derived_from``) with the problem's totals."""
    totals = {
        "dp": problem.training.num_gpus,
        "grad_accum": problem.training.global_batch_sequences,
    }
    out = []
    for derived, axes in PRODUCTS.items():
        family, source = PRODUCT_SOURCES[derived]
        total = totals[derived]
        text = f"{'*'.join(axes)} == {'GPUs' if derived == 'dp' else family} ({total})"
        out.append(Product(family=family, text=text, axes=axes, total=total, source=source))
    return tuple(out)


def derive(problem: Problem, given: Mapping[str, int]) -> dict[str, int]:
    """The derived axes (``dp``, then ``grad_accum``) of the free values ``given``, each the
    total of its product over the others; ``InputError`` names the product they do not divide."""
    values = dict(given)
    for product in products(problem):
        derived = product.axes[-1]
        factors = [values[a] for a in product.axes[:-1]]
        part = int(np.prod(factors))
        if product.total % part:
            raise InputError(
                f"{'*'.join(product.axes[:-1])} = {part} does not divide the "
                f"{product.family} ({product.total})",
                source="layout",
                field=product.family,
            )
        values[derived] = product.total // part
    return values


DERIVED: tuple[str, ...] = tuple(axis.name for axis in AXES if axis.derived_from)
"""Axes fixed by a product, in table order (``dp`` before ``grad_accum``, which needs it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Space:
    """The domains, rules and products of one problem."""

    domains: Mapping[str, tuple[int, ...]]
    """Each axis's values; single-axis rules already applied (``unpruned_domains`` before)."""
    rules: tuple[Rule, ...]
    """The rules over several axes (single-axis ones live in the pruned domains)."""
    products: tuple[Product, ...]
    unpruned_domains: Mapping[str, tuple[int, ...]]
    single_axis_rules: tuple[Rule, ...]

    def unpruned(self) -> Space:
        """This space with the single-axis rules as rules again, not folded into the domains
        (for the infeasible core, whose assumption literals must see every rule)."""
        return Space(
            domains=self.unpruned_domains,
            rules=(*self.single_axis_rules, *self.rules),
            products=self.products,
            unpruned_domains=self.unpruned_domains,
            single_axis_rules=(),
        )

    @property
    def all_rules(self) -> tuple[Rule, ...]:
        return (*self.single_axis_rules, *self.rules)

    def free_axes(self, axes: Iterable[str]) -> tuple[str, ...]:
        """The axes that determine ``axes``: each derived axis (``grad_accum``, ``dp``) is
        replaced by the axes its product fixes it from."""
        need = set(axes)
        for derived in reversed(DERIVED):
            if derived in need:
                need = (need - {derived}) | set(AXIS[derived].derived_from)
        return tuple(a for a in GRID_AXES if a in need)

    def key_axes(self, axes: Iterable[str]) -> tuple[str, ...]:
        """``free_axes`` less the constants (axes with one allowed value): a table's columns."""
        return tuple(a for a in self.free_axes(axes) if len(self.domains[a]) > 1)

    def pruned_grid(self, axes: Iterable[str]) -> dict[str, np.ndarray]:
        """Rows over the free axes of ``axes`` (with the derived columns they need) that every
        rule over those axes allows and that satisfy the products (DESIGN §3).

        Built as a join, one axis at a time, filtering as soon as a rule's axes are all present,
        so the unpruned Cartesian product is never materialised.
        """
        axes = tuple(dict.fromkeys(axes))
        derive = {a for a in DERIVED if a in axes}
        for derived in reversed(DERIVED):
            if derived in derive:
                derive |= {a for a in AXIS[derived].derived_from if a in DERIVED}
        grid: dict[str, np.ndarray] = {}
        applied: set[int] = set()
        size = 1
        for axis in self.free_axes(axes):
            values = np.array(self.domains[axis], dtype=np.int64)
            joined = _Join(grid, np.repeat(np.arange(size), len(values)))
            joined.put(axis, np.tile(values, size))
            self._derive(joined, derive)
            self._filter(joined, applied)
            grid = joined.columns()
            size = len(grid[axis])
        return grid

    def _product_of(self, derived: str) -> Product:
        return next(p for p in self.products if derived in p.axes)

    def _derive(self, grid: _Join, derive: set[str]) -> None:
        """Add each derived axis (``total / product of the others``) once its inputs are in,
        keeping the rows where it is a whole number in its domain."""
        for derived in DERIVED:
            inputs = AXIS[derived].derived_from
            if derived not in derive or derived in grid or not set(inputs) <= set(grid):
                continue
            total = self._product_of(derived).total
            others = _product([grid[a] for a in inputs])
            ok = total % others == 0
            value = total // np.where(ok, others, 1)
            grid.keep(ok & np.isin(value, self.domains[derived]))
            grid.put(derived, total // _product([grid[a] for a in inputs]))

    def _filter(self, grid: _Join, applied: set[int]) -> None:
        """Apply the rules that just became complete, and the products' partial divisibility."""
        present = set(grid)
        keep = np.ones(grid.rows, dtype=bool)
        for i, rule in enumerate(self.rules):
            if i not in applied and set(rule.axes) <= present:
                keep &= rule.check(grid)
                applied.add(i)
        for product in self.products:
            inside = [a for a in product.axes if a in present]
            if len(inside) > 1:
                keep &= product.total % _product([grid[a] for a in inside]) == 0
        grid.keep(keep)

    def broken_rule(self, row: Mapping[str, int], *, skip: Iterable[str] = ()) -> str | None:
        """The first product or rule (outside the families in ``skip``) that a full layout
        row breaks, as text with its source; ``None`` when it keeps them all."""
        skip = set(skip)
        for product in self.products:
            total = int(np.prod([row[a] for a in product.axes]))
            if product.family not in skip and total != product.total:
                return f"{product.family}: breaks {product.text}: got {total}"
        grid = {axis: np.array([value]) for axis, value in row.items()}
        for rule in self.all_rules:
            if rule.family not in skip and not bool(rule.check(grid)[0]):
                return f"{rule.family}: breaks {rule.text} ({rule.source})"
        return None


class _Join(Mapping[str, np.ndarray]):
    """One step of ``Space.pruned_grid``'s join: the rows of ``grid`` repeated (``parent``: the
    grid row of each joined row) with new columns beside them. A grid column is gathered only
    when a rule or a product reads it, filters keep row numbers, and the rest is gathered once
    at the end (``columns``): the rows and their order are those of repeating every column and
    filtering each (an issue-19 profile: that copying was two thirds of ``pruned_grid``)."""

    def __init__(self, grid: Mapping[str, np.ndarray], parent: np.ndarray) -> None:
        self._grid, self._parent = grid, parent
        self._own: dict[str, np.ndarray] = {}  # the new columns and those gathered, kept rows

    def __getitem__(self, axis: str) -> np.ndarray:
        if axis not in self._own:
            self._own[axis] = self._grid[axis][self._parent]
        return self._own[axis]

    def __iter__(self):
        yield from self._grid
        yield from (a for a in self._own if a not in self._grid)

    def __len__(self) -> int:
        return len(set(self._grid) | set(self._own))

    @property
    def rows(self) -> int:
        return len(self._parent)

    def put(self, axis: str, column: np.ndarray) -> None:
        self._own[axis] = column

    def keep(self, rows: np.ndarray) -> None:
        """Only the rows where ``rows`` (a boolean per row)."""
        if rows.all():
            return
        self._parent = self._parent[rows]
        self._own = {a: v[rows] for a, v in self._own.items()}

    def columns(self) -> dict[str, np.ndarray]:
        """Every column at the kept rows, in the grid's order, then the new ones."""
        return {a: self[a] for a in self}


def _product(columns: list[np.ndarray]) -> np.ndarray:
    """``np.prod(columns, axis=0)`` without stacking the columns into one array first (int64:
    the same products, in any order)."""
    out = columns[0]
    for column in columns[1:]:
        out = out * column
    return out


def build_space(problem: Problem) -> Space:
    """The space of ``problem``: the axes' domains, with the single-axis rules folded in."""
    unpruned = {axis.name: axis.values(problem) for axis in AXES}
    return space_of(problem, layout_rules(problem), unpruned)


def space_of(
    problem: Problem, rules: Iterable[Rule], unpruned: Mapping[str, tuple[int, ...]]
) -> Space:
    """A space over ``unpruned`` domains and ``rules`` (the single-axis ones folded into the
    domains), with the problem's products: ``build_space``'s, or a variant of it (the per-stage
    plan search swaps the pipeline-split rules and fixes ``recompute``)."""
    rules = tuple(rules)
    domains = dict(unpruned)
    single = tuple(rule for rule in rules if len(rule.axes) == 1)
    for rule in single:
        axis = rule.axes[0]
        values = np.array(domains[axis], dtype=np.int64)
        domains[axis] = tuple(int(v) for v in values[rule.check({axis: values})])
    return Space(
        domains=domains,
        rules=tuple(rule for rule in rules if len(rule.axes) > 1),
        products=products(problem),
        unpruned_domains=dict(unpruned),
        single_axis_rules=single,
    )
