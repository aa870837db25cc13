"""Build the CP-SAT model: layout variables, rules, products and the cost model as tables.

The objective is the cost model (DESIGN §3): every term is tabulated in numpy over its own axes
(``Space.pruned_grid``) and linked to an integer value variable with ``add_allowed_assignments``;
the step time is ``sum(step terms) + slots * sum(micro-batch terms)`` and the memory constraint
``sum(static) + in_flight * sum(per micro-batch) <= capacity`` (``autopar.terms``). Each product
``slots * term`` is tabulated as one table over the union of both axes, and ``dp`` and
``grad_accum`` are derived from the free axes (``Space.key_axes``), so the model holds only tables
and linear sums: no multiplication of variables, which CP-SAT relaxes poorly. Floats become
integers only here: times in microseconds (``_us``), memory in KiB (``_kib``, rounded up).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from autopar.plan import GRID_AXES
from autopar.space import Space
from autopar.terms import CostModel, TermContext

US_PER_S = 1_000_000
FUSE_MAX_ROWS = 20_000
"""Largest table built by merging summands (see ``_fuse``)."""
BYTES_PER_KIB = 1024


@dataclass(slots=True)
class VarMap:
    """The model's variables by name, and the assumption literal of each rule family."""

    axes: dict[str, cp_model.IntVar]
    objective: cp_model.LinearExpr
    """Step time in microseconds (``step_us``)."""
    memory_kib: cp_model.LinearExpr
    """Memory of the most loaded rank in KiB."""
    capacity_kib: int
    families: dict[str, cp_model.IntVar] = field(default_factory=dict)


def _int_table(values: np.ndarray, scale: float, *, ceil: bool) -> np.ndarray:
    scaled = values * scale
    return (np.ceil(scaled) if ceil else np.round(scaled)).astype(np.int64)


def _family_literal(model: cp_model.CpModel, vm: VarMap, family: str | None):
    if family is None:
        return None
    if family not in vm.families:
        vm.families[family] = model.new_bool_var(f"rule[{family}]")
    return vm.families[family]


def _table(model: cp_model.CpModel, space: Space, vm: VarMap, *, name: str,
           axes: tuple[str, ...], values_of, scale: float, ceil: bool) -> cp_model.IntVar | int:
    """A value variable equal to ``values_of(grid) * scale`` (as integers) on every allowed row of
    ``axes``, linked with ``add_allowed_assignments`` over the free (key) axes."""
    grid = space.pruned_grid(axes)
    key = space.key_axes(axes)
    if not key:
        value = np.atleast_1d(np.asarray(values_of({}), dtype=np.float64))
        return int(_int_table(value, scale, ceil=ceil)[0])
    values = np.broadcast_to(np.asarray(values_of(grid), dtype=np.float64), grid[key[0]].shape)
    ok = np.isfinite(values)
    ints = _int_table(np.where(ok, values, 0.0), scale, ceil=ceil)[ok]
    if len(ints) == 0:
        model.add_bool_or([])  # no allowed row: this term makes the problem infeasible
        return 0
    value = model.new_int_var_from_domain(cp_model.Domain.from_values(np.unique(ints).tolist()),
                                          f"{name}[{','.join(key)}]")
    rows = np.column_stack([grid[a][ok] for a in key] + [ints])
    model.add_allowed_assignments([vm.axes[a] for a in key] + [value], rows.tolist())
    return value


@dataclass(frozen=True, slots=True)
class _Part:
    """A summand of the objective or of the memory: ``values_of(grid)`` over ``axes``."""

    name: str
    axes: tuple[str, ...]
    values_of: Callable[[dict[str, np.ndarray]], np.ndarray]


def _term_part(term, ctx: TermContext, times=None) -> _Part:
    """One term, or ``times * term`` over the union of both terms' axes."""
    if times is None:
        return _Part(term.name, tuple(term.depends_on), lambda g: term.evaluate(g, ctx))
    return _Part(f"{times.name}*{term.name}", (*term.depends_on, *times.depends_on),
                 lambda g: times.evaluate(g, ctx) * term.evaluate(g, ctx))


def _fuse(space: Space, parts: list[_Part], *, max_rows: int) -> list[_Part]:
    """Merge summands into fewer tables while the merged table stays within ``max_rows``.

    A sum of many small tables gives CP-SAT a weak linear relaxation; one table over the union
    of their axes is exact. Merging stops where tables would grow past ``max_rows``.
    """
    parts = sorted(parts, key=lambda p: -len(space.key_axes(p.axes)))
    merged: list[_Part] = []
    for part in parts:
        for i, group in enumerate(merged):
            axes = (*group.axes, *part.axes)
            if _rows(space, axes) <= max_rows:
                merged[i] = _Part(f"{group.name}+{part.name}", axes,
                                  lambda g, a=group, b=part: a.values_of(g) + b.values_of(g))
                break
        else:
            merged.append(part)
    return merged


def _rows(space: Space, axes: tuple[str, ...]) -> int:
    key = space.key_axes(axes)
    return len(next(iter(space.pruned_grid(axes).values()))) if key else 1


def _add_layout(model: cp_model.CpModel, space: Space, vm: VarMap, *, explain: bool) -> None:
    for axis in GRID_AXES:
        vm.axes[axis] = model.new_int_var_from_domain(
            cp_model.Domain.from_values(list(space.domains[axis])), axis)
    # Each product rule (GPU count, global batch): the allowed factorisations of its total.
    for product in space.products:
        grid = _full_grid(space, product.axes)
        rows = np.column_stack([grid[a] for a in product.axes])
        rows = rows[np.prod(rows, axis=1) == product.total]
        constraint = model.add_allowed_assignments([vm.axes[a] for a in product.axes],
                                                   rows.tolist())
        if explain:
            constraint.only_enforce_if(_family_literal(model, vm, product.family))
    # Every other rule: an allowed-assignments table over its axes.
    for rule in space.rules:
        grid = _full_grid(space, rule.axes)
        rows = np.column_stack([grid[a] for a in rule.axes])[rule.check(grid)]
        constraint = model.add_allowed_assignments([vm.axes[a] for a in rule.axes],
                                                   rows.tolist())
        if explain:
            constraint.only_enforce_if(_family_literal(model, vm, rule.family))


def _full_grid(space: Space, axes: Sequence[str]) -> dict[str, np.ndarray]:
    mesh = np.meshgrid(*(np.array(space.domains[a], dtype=np.int64) for a in axes),
                       indexing="ij")
    return {a: m.ravel() for a, m in zip(axes, mesh, strict=True)}


def _add_cost(model: cp_model.CpModel, space: Space, cost_model: CostModel, ctx: TermContext,
              vm: VarMap) -> None:
    """Objective and memory as sums of tables; each per-micro-batch term is tabulated already
    multiplied by its multiplier (``slots`` or ``in_flight``), over the union of their axes,
    so CP-SAT sees no product of variables."""
    time_parts = [_term_part(t, ctx) for t in cost_model.step_terms]
    time_parts += [_term_part(t, ctx, cost_model.slots) for t in cost_model.microbatch_terms]
    memory_parts = [_term_part(t, ctx) for t in cost_model.static_memory_terms]
    memory_parts += [_term_part(t, ctx, cost_model.in_flight)
                     for t in cost_model.microbatch_memory_terms]
    vm.objective = sum(
        _table(model, space, vm, name=p.name, axes=p.axes, values_of=p.values_of,
               scale=US_PER_S, ceil=False)
        for p in _fuse(space, time_parts, max_rows=FUSE_MAX_ROWS))
    vm.memory_kib = sum(
        _table(model, space, vm, name=p.name, axes=p.axes, values_of=p.values_of,
               scale=1 / BYTES_PER_KIB, ceil=True)
        for p in _fuse(space, memory_parts, max_rows=FUSE_MAX_ROWS))


def build_model(space: Space, cost_model: CostModel, ctx: TermContext, *, explain: bool = False,
                memory_limit: bool = True) -> tuple[cp_model.CpModel, VarMap]:
    """The CP-SAT model of ``space`` with ``cost_model`` as objective.

    ``explain`` guards every rule family (and the memory capacity) with an assumption literal, for
    ``sufficient_assumptions_for_infeasibility``; the model then has no objective.
    """
    model = cp_model.CpModel()
    vm = VarMap(axes={}, objective=0, memory_kib=0,
                capacity_kib=ctx.cluster.usable_memory_bytes // BYTES_PER_KIB)
    _add_layout(model, space, vm, explain=explain)
    _add_cost(model, space, cost_model, ctx, vm)
    if memory_limit:
        # The most loaded rank fits in the GPU's usable memory.
        fits = model.add(vm.memory_kib <= vm.capacity_kib)
        if explain:
            fits.only_enforce_if(_family_literal(model, vm, "memory"))
    if explain:
        model.add_assumptions(list(vm.families.values()))
    return model, vm
