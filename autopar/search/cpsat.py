"""Build the CP-SAT model (layout variables, rules, products and the cost model as tables) and
the solver settings every solve uses.

The objective is the cost model (DESIGN §3): every term is tabulated in numpy over its own axes
(``Space.pruned_grid``) and enters the model as a table: one boolean per allowed row, channelled
to the axes' value indicators (``_table``; the rules and products, which carry no values, are
plain ``add_allowed_assignments`` tables). The step time is
``sum(step terms) + slots * sum(micro-batch terms)`` and the memory constraint
``sum(static) + in_flight * sum(per micro-batch) <= capacity`` (``autopar.costs.terms``). Each
product
``slots * term`` is tabulated as one table over the union of both axes, and ``dp`` and
``grad_accum`` are derived from the free axes (``Space.key_axes``), so the model holds only tables
and linear sums: no multiplication of variables, which CP-SAT relaxes poorly. Floats become
integers only here: times in microseconds (``_us``), memory in KiB (``_kib``, rounded up).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from autopar.base.axes import GRID_AXES
from autopar.base.deadline import check_deadline
from autopar.costs.terms import (
    CostModel,
    CostTerm,
    Phases,
    TermContext,
    slot_phases,
    term_phases,
    weighted,
)
from autopar.layout.space import Space

SEED = 20240607
US_PER_S = 1_000_000
MAX_STEP_US = 10**15
"""Upper end of the step-time variable (31 years): any real layout is far below it."""
MAX_TABLE_INT = 10**16
"""Largest value of one table row once scaled (microseconds, KiB): sums of a few tables stay
within CP-SAT's 64-bit integers."""
MERGE_MAX_ROWS = 300_000
"""Tables merged from several terms grow to at most this many rows (see ``_merge``): 300k keeps
Qwen3-30B-A3B @ 256 GPUs to one time table (7.8 s proven vs 20 s at 150k) and halves the other
MoE solves (benchmarks/solve_scaling.py)."""
BYTES_PER_KIB = 1024
CHECK_EVERY_ROWS = 8192
"""Building a table checks the deadline after every this many rows (a few ms of work)."""


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
    indicators: dict[str, dict[int, cp_model.IntVar]] = field(default_factory=dict)
    deadline: float | None = None
    """``time.perf_counter()`` by which the build must be done (``TimeLimitReached``)."""
    hint_row: dict[str, int] | None = None
    """A whole layout (grid row) known to fit: every variable is hinted to it."""


def make_solver(
    *, time_limit_s: float, num_workers: int = 1, probing: bool = False
) -> cp_model.CpSolver:
    """A CP-SAT solver with autopar's settings: fixed seed; no presolve, since the tables arrive
    reduced to their allowed rows and presolve spends seconds on the row booleans that the linear
    relaxation does not need (benchmarks/solve_scaling.py has the before/after figures); probing
    off for optimisation and on (``probing``) for proving infeasibility, which leans on it
    (5-10x faster on the oracle's infeasible cases)."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = SEED
    solver.parameters.max_time_in_seconds = max(0.0, time_limit_s)
    solver.parameters.cp_model_presolve = False
    # Ctrl-C is autopar's, not CP-SAT's: it stops the run (autopar.search.interrupt), where CP-SAT
    # would end the search as if the time limit had run out and the run would carry on.
    solver.parameters.catch_sigint_signal = False
    if not probing:
        solver.parameters.cp_model_probing_level = 0
    return solver


def _int_table(values: np.ndarray, scale: float, *, ceil: bool) -> np.ndarray:
    scaled = values * scale
    return (np.ceil(scaled) if ceil else np.round(scaled)).astype(np.int64)


def _family_literal(model: cp_model.CpModel, vm: VarMap, family: str | None):
    if family is None:
        return None
    if family not in vm.families:
        vm.families[family] = model.new_bool_var(f"rule[{family}]")
    return vm.families[family]


class _Grids:
    """``Space.pruned_grid`` memoised by axis set, for one model build; every lookup (one per
    term evaluation) checks the build's deadline."""

    def __init__(self, space: Space, deadline: float | None = None) -> None:
        self.space = space
        self.deadline = deadline
        self._cache: dict[frozenset[str], dict[str, np.ndarray]] = {}

    def grid(self, axes: tuple[str, ...]) -> dict[str, np.ndarray]:
        check_deadline(self.deadline)
        key = frozenset(axes)
        if key not in self._cache:
            self._cache[key] = self.space.pruned_grid(axes)
        return self._cache[key]

    def rows(self, axes: tuple[str, ...]) -> int:
        grid = self.grid(axes)
        return len(next(iter(grid.values()))) if grid else 1


@dataclass(frozen=True, slots=True)
class _Part:
    """A summand of the objective or of the memory: ``values_of(grid)`` over ``axes``."""

    name: str
    axes: tuple[str, ...]
    values_of: Callable[[dict[str, np.ndarray]], np.ndarray]


def _table(
    model: cp_model.CpModel,
    grids: _Grids,
    vm: VarMap,
    *,
    part: _Part,
    scale: float,
    ceil: bool,
    hint: bool = False,
):
    """A linear expression equal to ``part.values_of(grid) * scale`` (integers) on the chosen row.

    Encoding (the local-marginal extended formulation of a table constraint): one boolean per
    allowed row, exactly one chosen, and for every key axis and value, the rows with that value
    sum to the axis's value indicator. Its linear relaxation links the tables through the shared
    indicators, which gives CP-SAT a far tighter bound than ``add_allowed_assignments``.
    With ``hint``, the row of smallest value is the solver's hint (the greedy start that
    STYLE §2.4 asks for): when it satisfies the other constraints, it is the optimum. With a
    ``VarMap.hint_row`` (a whole layout that fits), every table's row of that layout is hinted
    instead, so CP-SAT starts from a feasible solution.
    """
    grid = grids.grid(part.axes)
    key = grids.space.key_axes(part.axes)
    size = len(next(iter(grid.values()))) if grid else 1
    values = np.broadcast_to(np.asarray(part.values_of(grid), dtype=np.float64), (size,))
    # A row whose value is not finite, or too large for CP-SAT's 64-bit integers once scaled
    # (a step of centuries, exabytes of memory: a broken profile's figures), is impossible.
    with np.errstate(over="ignore", invalid="ignore"):
        ok = np.isfinite(values) & (np.abs(values * scale) <= MAX_TABLE_INT)
    if not key and size == 1:
        if not ok[0]:
            model.add_bool_or([])  # the only combination is impossible
            return 0
        return int(_int_table(values, scale, ceil=ceil)[0])
    ints = _int_table(np.where(ok, values, 0.0), scale, ceil=ceil)[ok]
    if len(ints) == 0:
        model.add_bool_or([])  # no allowed row: this term makes the problem infeasible
        return 0
    rows = []
    for start in range(0, len(ints), CHECK_EVERY_ROWS):
        check_deadline(vm.deadline)
        stop = min(start + CHECK_EVERY_ROWS, len(ints))
        rows += [model.new_bool_var(f"{part.name}#{i}") for i in range(start, stop)]
    model.add_exactly_one(rows)
    if vm.hint_row is not None:
        match = np.ones(len(ints), dtype=bool)
        for axis in key:
            match &= grid[axis][ok] == vm.hint_row[axis]
        for i in np.flatnonzero(match)[:1].tolist():
            model.add_hint(rows[i], 1)
    elif hint:
        best = int(np.argmin(ints))
        model.add_hint(rows[best], 1)
        for axis in key:
            model.add_hint(vm.axes[axis], int(grid[axis][ok][best]))
    channel_rows(model, vm, rows, {axis: grid[axis][ok] for axis in key})
    return cp_model.LinearExpr.weighted_sum(rows, ints.tolist())


def channel_rows(
    model: cp_model.CpModel,
    vm: VarMap,
    rows: Sequence[cp_model.IntVar],
    columns: Mapping[str, np.ndarray],
) -> None:
    """Tie row booleans (one per row of a table, exactly one chosen) to the layout: for every
    axis of ``columns`` and value, the rows with that value sum to the value's indicator (the
    local-marginal encoding of ``_table``; the per-stage search links its outer rows so)."""
    for axis, column in columns.items():
        check_deadline(vm.deadline)
        for value, indicator in vm.indicators[axis].items():
            members = [rows[i] for i in np.flatnonzero(column == value)]
            model.add(cp_model.LinearExpr.sum(members) == indicator)


def _term_part(term, ctx: TermContext, times=None) -> _Part:
    """One term, or ``times * term`` over the union of both terms' axes."""
    if times is None:
        return _Part(term.name, tuple(term.depends_on), lambda g: term.evaluate(g, ctx))
    return _Part(
        f"{times.name}*{term.name}",
        (*term.depends_on, *times.depends_on),
        lambda g: times.evaluate(g, ctx) * term.evaluate(g, ctx),
    )


def _slotted_part(term, ctx: TermContext, slots, reference: Phases) -> _Part:
    """``term`` weighted by the slots of its phases (``autopar.costs.terms.weighted``), the
    slots taken at the ``reference`` phase times: a lower bound of the layout's own, equal to it
    wherever the schedule's longest path is the reference's (``schedule_slots``)."""

    def values(g: dict[str, np.ndarray]) -> np.ndarray:
        size = len(next(iter(g.values()))) if g else 1
        at = Phases(*(np.full(size, float(x)) for x in reference))
        return weighted(slot_phases(slots, g, ctx, at), term_phases(term, g, ctx, size))

    return _Part(f"{slots.name}*{term.name}", (*term.depends_on, *slots.depends_on), values)


def reference_phases(grids: _Grids, terms, ctx: TermContext) -> Phases:
    """The phase times the solver takes the schedules' slots at: the sum over the micro-batch
    terms of each one's median over its own rows (``_slotted_part``)."""
    parts = []
    for term in terms:
        grid = grids.grid(tuple(term.depends_on))
        size = len(next(iter(grid.values()))) if grid else 1
        phases = term_phases(term, grid, ctx, size)
        parts.append([float(np.median(x)) if size else 0.0 for x in phases])
    return Phases(*(float(sum(p[i] for p in parts)) for i in range(4)))


def _scaled(part: _Part, factor: CostTerm, ctx: TermContext) -> _Part:
    """``factor * part`` over the union of their axes."""
    return _Part(
        f"{factor.name}*{part.name}",
        (*part.axes, *factor.depends_on),
        lambda g: factor.evaluate(g, ctx) * part.values_of(g),
    )


def _merge(grids: _Grids, parts: list[_Part], *, max_rows: int) -> list[_Part]:
    """Sum parts into fewer tables: a part joins a table when the table over the union of their
    axes has at most ``max(max_rows, rows of the larger)`` rows (always when one's free axes
    contain the other's). Fewer, exact tables give CP-SAT a tight linear relaxation; a sum of
    many small tables leaves it to branch (benchmarks/solve_scaling.py)."""
    merged: list[_Part] = []
    for part in sorted(parts, key=lambda p: -grids.rows(p.axes)):
        for i, group in enumerate(merged):
            axes = (*group.axes, *part.axes)
            if grids.rows(axes) <= max(max_rows, grids.rows(group.axes)):
                merged[i] = _Part(
                    f"{group.name}+{part.name}",
                    axes,
                    lambda g, a=group, b=part: a.values_of(g) + b.values_of(g),
                )
                break
        else:
            merged.append(part)
    return merged


def _fold_constants(grids: _Grids, parts: list[_Part]) -> list[_Part]:
    """Parts whose value is the same on every allowed row of their grid (a ZeRO-2/3 term when
    only ZeRO 0-1 are allowed, an expert term of a dense model) become one constant part with
    no axes, which ``_merge`` adds to any table: a table of identical rows would only give
    CP-SAT more booleans and a weaker link between the tables that matter."""
    varying, constant = [], 0.0
    for part in parts:
        grid = grids.grid(part.axes)
        values = np.asarray(part.values_of(grid), dtype=np.float64).ravel()
        same = values.size and np.isfinite(values[0]) and np.all(values == values[0])
        if grids.rows(part.axes) and same:
            constant += float(values[0])
            continue
        varying.append(part)
    if constant or not varying:
        varying.append(_Part("constants", (), lambda g, c=constant: np.asarray(c)))
    return varying


def layout_model(space: Space, *, deadline: float | None = None) -> tuple[cp_model.CpModel, VarMap]:
    """A model of the layout alone: the axes with their value indicators, the products and the
    rules, no cost (a caller such as ``autopar.pipeline`` adds its own objective)."""
    model = cp_model.CpModel()
    vm = VarMap(axes={}, objective=0, memory_kib=0, capacity_kib=0, deadline=deadline)
    _add_layout(model, space, vm, explain=False)
    return model, vm


FOLDED: tuple[str, ...] = ("schedule",)
"""Axes the single fused table keeps only the best value of, per value of its other axes: the
pipeline schedule changes the slots and the memory of a layout but no rule or table outside
this one, so for each outer layout only its fastest fitting schedule can be optimal (by the
objective; ``autopar.search.solver`` re-ranks a layout's schedules by their simulation). The
table shrinks by the schedules' count (Llama-3 70B on torchtitan: 16,649 rows to 6,311)."""


def _fold(
    g: dict[str, np.ndarray], values: np.ndarray, folded: list[str], keys: tuple[str, ...]
) -> np.ndarray:
    """``values`` with every row but the least of its group (same values of ``keys`` other
    than ``folded``; ties to the smallest folded value) set to ``inf`` (``FOLDED``)."""
    others = [a for a in keys if a not in folded]
    if not folded or not len(values):
        return values
    columns = [np.asarray(g[a]) for a in (*reversed(folded), *reversed(others))]
    order = np.lexsort([*columns[: len(folded)], values, *columns[len(folded) :]])
    group = np.column_stack([np.asarray(g[a]) for a in others]) if others else None
    first = np.ones(len(order), dtype=bool)
    if group is not None:
        sorted_group = group[order]
        first[1:] = np.any(sorted_group[1:] != sorted_group[:-1], axis=1)
    else:
        first[1:] = False
    keep = np.zeros(len(values), dtype=bool)
    keep[order[first]] = True
    return np.where(keep, values, np.inf)


def _add_layout(model: cp_model.CpModel, space: Space, vm: VarMap, *, explain: bool) -> None:
    for axis in GRID_AXES:
        domain = list(space.domains[axis])
        vm.axes[axis] = model.new_int_var_from_domain(cp_model.Domain.from_values(domain), axis)
        vm.indicators[axis] = {v: model.new_bool_var(f"{axis}=={v}") for v in domain}
        model.add_exactly_one(vm.indicators[axis].values())
        model.add(vm.axes[axis] == sum(v * b for v, b in vm.indicators[axis].items()))
        if vm.hint_row is not None and vm.hint_row[axis] in vm.indicators[axis]:
            model.add_hint(vm.axes[axis], vm.hint_row[axis])
            for value, indicator in vm.indicators[axis].items():
                model.add_hint(indicator, int(value == vm.hint_row[axis]))
    # Each product rule (GPU count, global batch): the allowed factorisations of its total.
    for product in space.products:
        check_deadline(vm.deadline)
        rows = _factorisations(space, product.axes, product.total)
        constraint = model.add_allowed_assignments(
            [vm.axes[a] for a in product.axes], rows.tolist()
        )
        if explain:
            constraint.only_enforce_if(_family_literal(model, vm, product.family))
    # Every other rule: an allowed-assignments table over its axes.
    for rule in space.rules:
        check_deadline(vm.deadline)
        grid = _full_grid(space, rule.axes)
        rows = np.column_stack([grid[a] for a in rule.axes])[rule.check(grid)]
        constraint = model.add_allowed_assignments([vm.axes[a] for a in rule.axes], rows.tolist())
        if explain:
            constraint.only_enforce_if(_family_literal(model, vm, rule.family))


def _factorisations(space: Space, axes: Sequence[str], total: int) -> np.ndarray:
    """Rows of ``axes`` values (from their domains) whose product is ``total``: joined one axis
    at a time keeping only partial products that divide ``total``, the last axis being
    ``total / partial`` when its domain holds it. The full Cartesian product of four axes of
    240 divisors each (831600 GPUs) would be 3.3e9 rows; the factorisations are about 1e5."""
    rows = np.ones((1, 0), dtype=np.int64)
    partial = np.ones(1, dtype=np.int64)
    for axis in axes[:-1]:
        values = np.array(space.domains[axis], dtype=np.int64)
        partial = np.repeat(partial, len(values)) * np.tile(values, len(partial))
        rows = np.column_stack([np.repeat(rows, len(values), axis=0), np.tile(values, len(rows))])
        keep = total % partial == 0
        rows, partial = rows[keep], partial[keep]
    last = total // partial
    keep = np.isin(last, np.array(space.domains[axes[-1]], dtype=np.int64))
    return np.column_stack([rows[keep], last[keep]])


def _full_grid(space: Space, axes: Sequence[str]) -> dict[str, np.ndarray]:
    mesh = np.meshgrid(*(np.array(space.domains[a], dtype=np.int64) for a in axes), indexing="ij")
    return {a: m.ravel() for a, m in zip(axes, mesh, strict=True)}


def _add_cost(
    model: cp_model.CpModel,
    space: Space,
    cost_model: CostModel,
    ctx: TermContext,
    vm: VarMap,
    *,
    fuse_memory: bool,
    time_factor: CostTerm | None = None,
) -> bool:
    """Objective and memory as sums of tables; each per-micro-batch term is tabulated already
    multiplied by its multiplier (``slots`` or ``in_flight``), over the union of their axes,
    so CP-SAT sees no product of variables. A ``time_factor`` (the expected wall seconds per
    training second under failures, ``autopar.costs.goodput.OverheadFactor``) multiplies every
    time table the same way, over the union of its axes: the objective is then the expected time
    per useful step, still a sum of tables.

    With ``fuse_memory``, when time and memory each merge into one table and their union stays
    small, the capacity becomes a row filter of that single table ("resource terms become
    allowed-row tables", DESIGN §3); returns whether it did.
    """
    grids = _Grids(space, vm.deadline)
    time_parts = [_term_part(t, ctx) for t in cost_model.step_terms]
    reference = reference_phases(grids, cost_model.microbatch_terms, ctx)
    time_parts += [
        _slotted_part(t, ctx, cost_model.slots, reference) for t in cost_model.microbatch_terms
    ]
    memory_parts = [_term_part(t, ctx) for t in cost_model.static_memory_terms]
    memory_parts += [
        _term_part(t, ctx, cost_model.in_flight) for t in cost_model.microbatch_memory_terms
    ]
    times = _merge(grids, _fold_constants(grids, time_parts), max_rows=MERGE_MAX_ROWS)
    if time_factor is not None:
        times = [_scaled(part, time_factor, ctx) for part in times]
    memories = _merge(grids, _fold_constants(grids, memory_parts), max_rows=MERGE_MAX_ROWS)
    if fuse_memory and len(times) == 1 and len(memories) == 1:
        axes = (*times[0].axes, *memories[0].axes)
        if grids.rows(axes) <= max(MERGE_MAX_ROWS, grids.rows(times[0].axes)):
            capacity_bytes = vm.capacity_kib * BYTES_PER_KIB
            time_of, memory_of = times[0].values_of, memories[0].values_of
            folded = [a for a in FOLDED if a in space.key_axes(axes)]

            def within(g: dict[str, np.ndarray]) -> np.ndarray:
                values = np.where(memory_of(g) <= capacity_bytes, time_of(g), np.inf)
                return _fold(g, values, folded, space.key_axes(axes))

            fused = _Part("step_time_within_memory", axes, within)
            vm.objective = _table(
                model, grids, vm, part=fused, scale=US_PER_S, ceil=False, hint=True
            )
            return True
    vm.objective = sum(
        _table(model, grids, vm, part=p, scale=US_PER_S, ceil=False, hint=i == 0)
        for i, p in enumerate(times)
    )
    vm.memory_kib = sum(
        _table(model, grids, vm, part=p, scale=1 / BYTES_PER_KIB, ceil=True) for p in memories
    )
    return False


def build_model(
    space: Space,
    cost_model: CostModel,
    ctx: TermContext,
    *,
    explain: bool = False,
    memory_limit: bool = True,
    deadline: float | None = None,
    time_factor: CostTerm | None = None,
    hint_row: dict[str, int] | None = None,
) -> tuple[cp_model.CpModel, VarMap]:
    """The CP-SAT model of ``space`` with ``cost_model`` as objective.

    ``explain`` builds the rules alone, each family guarded by an assumption literal, for
    ``sufficient_assumptions_for_infeasibility`` (no cost tables: their rows are pre-filtered by
    every rule, which would hide the conflict from the literals). Past ``deadline``
    (``time.perf_counter()`` seconds) the build stops with ``TimeLimitReached``. ``hint_row``
    (a grid row that fits) hints every variable to that layout.
    """
    model = cp_model.CpModel()
    vm = VarMap(
        axes={},
        objective=0,
        memory_kib=0,
        capacity_kib=ctx.cluster.usable_memory_bytes // BYTES_PER_KIB,
        deadline=deadline,
        hint_row=hint_row,
    )
    _add_layout(model, space, vm, explain=explain)
    if explain:
        model.add_assumptions(list(vm.families.values()))
        return model, vm
    fused = _add_cost(
        model, space, cost_model, ctx, vm, fuse_memory=memory_limit, time_factor=time_factor
    )
    # One variable for the step time, so that solution callbacks read it in O(1).
    step_us = model.new_int_var(0, MAX_STEP_US, "step_time_us")
    model.add(step_us == vm.objective)
    vm.objective = step_us
    if memory_limit and not fused:
        # The most loaded rank fits in the GPU's usable memory.
        model.add(vm.memory_kib <= vm.capacity_kib)
    return model, vm
