"""Per-stage pipeline plans in CP-SAT, chosen together with the outer layout (issue 13): the
search loop, written once for the three encodings (``autopar.pipeline.encoding``).

One model holds the layout axes (variables, value indicators, the rules and products of
``autopar.search.cpsat``) and, for every pipeline shape still in play, its plan variables
(``StageEncoding.add``). Outer layouts are rows: one boolean per row, exactly one chosen,
channelled to the axes' indicators; a row fixes every per-layer coefficient, so under its
boolean the stage times, memories and the objective are linear in the plan variables.

Rows are pruned before the model is built, without losing the optimum: every row has a lower
bound and, from a heuristic plan that fits, an upper bound (``autopar.pipeline.candidates``);
rows whose lower bound exceeds the best upper bound cannot hold the optimum. On the rows left,
each shape's encoding tightens both (exact per-stage or window tables; the boundary encoding
has none) and the rows are pruned again. The heuristic plan of the best row is the hint.

Runners-up (``--top``): the k-th best outer layout is the optimum over the rows other than the
first k-1, whose bounds stay valid (each row's bounds are its own). The solves share one
``SearchState``: the rows that can hold any of the ``top`` best are tightened once, before the
first solve, and every later solve reuses those bounds and tables (it tightens only rows that
were not, when fewer than ``top`` heuristic plans fit).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from autopar.base.axes import GRID_AXES
from autopar.base.deadline import TimeLimitReached, check_deadline
from autopar.costs.stage_costs import StageCosts
from autopar.costs.stage_estimate import with_plan_recompute
from autopar.costs.terms import CostModel, TermContext
from autopar.inputs.specs import Problem
from autopar.layout.plan import Layout
from autopar.layout.space import Space
from autopar.layout.stage_rules import restricts_plans
from autopar.pipeline.boundary import BoundaryEncoding
from autopar.pipeline.candidates import Candidates, candidates, per_stage_space
from autopar.pipeline.encoding import (
    CAPACITY_SLACK_BYTES,
    NS_PER_S,
    Bounds,
    Fix,
    RowLink,
    Shape,
    StageEncoding,
    ns,
    shapes_of,
)
from autopar.pipeline.expressible import solve_expressible_top
from autopar.pipeline.solution import StageSolution
from autopar.pipeline.tables import TableEncoding
from autopar.pipeline.windows import WindowEncoding
from autopar.search import interrupt
from autopar.search.cpsat import channel_rows, layout_model, make_solver

ABSOLUTE_GAP_NS = 10_000
"""Optimality tolerance: 10 microseconds of step time (the uniform model rounds every table to
a microsecond)."""
HINT_TIME_S = 2.0
"""Time to turn the heuristic plan into a full hint."""


def encoding_for(shape: Shape, kinds: Sequence[str], *, tables: bool = True) -> StageEncoding:
    """The encoding of ``shape``'s plans: per-stage tables for one layer kind, window tables
    for several kinds without interleaving, boundary variables otherwise (or for every shape
    when ``tables`` is false). Loop-placed shapes only: a V-placed schedule runs under
    torchtitan alone, whose plans are searched by enumeration (``autopar.pipeline.expressible``)."""
    if shape.placement != "loop":
        raise ValueError(f"the {shape.schedule.name} shape {shape.name} has no encoding")
    if tables and len(set(kinds)) == 1:
        return TableEncoding(shape)
    if tables and shape.vpp == 1:
        return WindowEncoding.of(shape, kinds)
    return BoundaryEncoding(shape)


@dataclass(frozen=True, slots=True)
class SearchState:
    """What the solves of one search share: the space, the candidates, the bounds as tightened
    so far, each shape's encoding with the tables built so far, and which rows are tightened."""

    space: Space
    cand: Candidates
    bounds: Bounds
    encodings: Mapping[Shape, StageEncoding]
    tightened: np.ndarray
    tables: bool

    @classmethod
    def of(cls, space: Space, cand: Candidates, *, tables: bool) -> SearchState:
        done = np.zeros(len(cand.bounds.lower_s), dtype=bool)
        done.flags.writeable = False
        return cls(space, cand, cand.bounds, {}, done, tables)

    def tighten(self, rows: np.ndarray, deadline: float | None) -> SearchState:
        """This state with ``rows`` tightened by their shapes' encodings (once per row)."""
        new = np.asarray(rows, dtype=np.int64)
        new = new[~self.tightened[new]]
        if not len(new):
            return self
        bounds, encodings = self.bounds, dict(self.encodings)
        kinds = self.cand.costs.layer_kinds
        for shape, index in shapes_of(self.cand.grid, new).items():
            check_deadline(deadline)
            encoding = encodings.get(shape) or encoding_for(shape, kinds, tables=self.tables)
            encodings[shape], bounds = encoding.tighten(bounds, index, self.cand.ctx)
        done = self.tightened.copy()
        done[new] = True
        done.flags.writeable = False
        return dataclasses.replace(self, bounds=bounds, encodings=encodings, tightened=done)


def solve_stages(
    problem: Problem,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    time_limit_s: float = 10.0,
    num_workers: int = 1,
    tables: bool = True,
) -> StageSolution:
    """The fastest layout with its per-stage plan, proven optimal when the status says so
    (``encoding_for``: ``tables`` false uses boundary variables for every shape). When the time
    limit runs out before the search starts, the status is ``unknown``."""
    return solve_stages_top(
        problem,
        ctx,
        cost_model,
        top=1,
        time_limit_s=time_limit_s,
        num_workers=num_workers,
        tables=tables,
    )[0]


def solve_stages_top(
    problem: Problem,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    top: int,
    time_limit_s: float = 10.0,
    num_workers: int = 1,
    tables: bool = True,
) -> list[StageSolution]:
    """The ``top`` best distinct outer layouts, each with its best per-stage plan, best first
    (``--top`` as ``autopar.search.solver`` reads it for uniform plans: distinct layouts; module
    docstring). Fewer come back when fewer layouts fit or the time limit runs out (a last
    ``unknown`` entry says so). A framework whose output takes only some plans
    (``autopar.layout.stage_rules``) is searched over those alone, by enumeration
    (``autopar.pipeline.expressible``)."""
    start = time.perf_counter()
    deadline = start + time_limit_s
    try:
        space = per_stage_space(problem)
        if not all(space.domains.values()):
            return [StageSolution.without_layout("infeasible", start)]
        cand = candidates(problem, space, ctx, cost_model, deadline=deadline)
        if restricts_plans(problem.options.framework):  # torchtitan's output takes only some
            framework = problem.options.framework
            return solve_expressible_top(cand, framework, top=top, start=start, deadline=deadline)
        state = SearchState.of(space, cand, tables=tables)
        state = state.tighten(state.bounds.rows_for_top(top), deadline)
    except TimeLimitReached:
        return [StageSolution.without_layout("unknown", start)]
    out: list[StageSolution] = []
    excluded: list[int] = []
    for _ in range(top):
        began = start if not out else time.perf_counter()
        try:
            solution, state = _solve_once(state, excluded, num_workers, began, deadline)
        except TimeLimitReached:
            solution = StageSolution.without_layout("unknown", start)
        if out and solution.row is None:
            if solution.status == "unknown":
                out.append(solution)
            break
        out.append(solution)
        if solution.row is None:
            break
        excluded.append(solution.row)
    return out


def _ceiling_ns(costs: StageCosts, grid: Mapping[str, np.ndarray], keep: np.ndarray) -> int:
    """An upper end for the step-time variable: every stage holding every layer at its slowest
    recompute, ``m + 1`` times, on the rows ``keep``."""
    costs = costs.take(keep)
    worst_layers = sum(costs.time_s[k].max(axis=1) for k in costs.layer_kinds)
    worst_stage = worst_layers + costs.every_time_s + costs.first_time_s + costs.last_time_s
    ceiling = costs.step_time_s + (grid["grad_accum"][keep] + 1.0) * (
        worst_stage + costs.every_time_s * grid["pp"][keep]
    )
    return ns(1.1 * float(np.max(ceiling, initial=1.0)) + 1.0)


def _build(state: SearchState, keep: np.ndarray, deadline: float):
    """The model over the rows ``keep``: layout variables, row booleans channelled to them,
    the objective with the rows' lower bounds as a cut, and each shape's encoding."""
    cand, lower = state.cand, state.bounds.lower_s
    grid = cand.grid
    model, vm = layout_model(state.space, deadline=deadline)
    x = {int(r): model.new_bool_var(f"row{r}") for r in keep}
    model.add_exactly_one(x.values())
    channel_rows(model, vm, list(x.values()), {axis: grid[axis][keep] for axis in GRID_AXES})
    max_ns = _ceiling_ns(cand.costs, grid, keep)
    objective = model.new_int_var(0, max_ns, "step_time_ns")
    # The rows' lower bounds as a cut (slightly loosened against rounding).
    model.add(objective >= sum(ns(lower[r] * (1 - 1e-7)) * x[r] for r in keep))
    # Coefficients are rounded to whole bytes: the slack keeps every plan that fits in float.
    capacity = int(cand.ctx.capacity_bytes) + CAPACITY_SLACK_BYTES
    link = RowLink(x=x, objective=objective, max_ns=max_ns, capacity_bytes=capacity, ctx=cand.ctx)
    handles = {
        shape: state.encodings[shape].add(model, rows, link)
        for shape, rows in shapes_of(grid, keep).items()
    }
    return model, link, handles


def _shape_of_row(grid: Mapping[str, np.ndarray], row: int) -> Shape:
    return next(iter(shapes_of(grid, np.array([row]))))


def _solve_once(
    state: SearchState,
    excluded: Sequence[int],
    num_workers: int,
    start: float,
    deadline: float,
) -> tuple[StageSolution, SearchState]:
    """The best outer layout and plan over the rows other than ``excluded``, and the state
    with any row it had to tighten."""
    state = state.tighten(state.bounds.open_rows(excluded), deadline)
    keep = state.bounds.open_rows(excluded)
    grid = state.cand.grid
    model, link, handles = _build(state, keep, deadline)
    best = state.bounds.best_row(excluded)
    if best is not None and best in link.x:
        shape = _shape_of_row(grid, best)
        hint = state.encodings[shape].hint(handles[shape], state.bounds.plans[best])
        left = max(0.0, deadline - time.perf_counter())
        _complete_hint(model, [(link.x[best], 1), *hint], time_limit_s=min(HINT_TIME_S, left))
    model.minimize(link.objective)
    build_s = time.perf_counter() - start
    solver = make_solver(
        time_limit_s=max(0.0, deadline - time.perf_counter()), num_workers=num_workers
    )
    # Times are integer nanoseconds; optimal means within ABSOLUTE_GAP_NS of the bound.
    solver.parameters.absolute_gap_limit = ABSOLUTE_GAP_NS
    status = interrupt.solve(solver, model)
    common = dict(
        rows_total=len(grid["pp"]),
        rows_kept=len(keep),
        candidates=state.cand,
        build_s=build_s,
        solve_s=time.perf_counter() - start - build_s,
    )
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        row = next(int(r) for r in keep if solver.boolean_value(link.x[int(r)]))
        shape = _shape_of_row(grid, row)
        plan = state.encodings[shape].decode(solver, handles[shape], row)
        found = dict(
            status="optimal" if status == cp_model.OPTIMAL else "feasible",
            plan=plan,
            step_time_s=solver.objective_value / NS_PER_S,
            bound_s=solver.best_objective_bound / NS_PER_S,
            row=row,
        )
    elif status != cp_model.INFEASIBLE and best is not None:
        # Out of time with no solution of its own: the heuristic plan stands, unproven.
        found = dict(
            status="feasible",
            plan=state.bounds.plans[best],
            step_time_s=float(state.bounds.upper_s[best]),
            bound_s=float(np.min(state.bounds.lower_s[keep])),
            row=best,
        )
    else:
        name = "infeasible" if status == cp_model.INFEASIBLE else "unknown"
        solution = StageSolution(
            status=name, layout=None, plan=None, step_time_s=None, bound_s=None, **common
        )
        return solution, state
    layout = Layout.from_grid_row({a: int(grid[a][found["row"]]) for a in GRID_AXES})
    solution = StageSolution(layout=with_plan_recompute(layout, found["plan"]), **found, **common)
    return solution, state


def _complete_hint(model: cp_model.CpModel, fixes: list[Fix], *, time_limit_s: float) -> bool:
    """Hint every variable: solve once with ``fixes`` assumed (the heuristic's row and plan),
    no objective yet, and hint that whole assignment (CP-SAT does not complete partial hints
    well here). Returns whether the heuristic's plan is a solution of the model."""
    literals = []
    for var, value in fixes:
        literal = model.new_bool_var("")
        model.add(var == value).only_enforce_if(literal)
        literals.append(literal)
    model.add_assumptions(literals)
    solver = make_solver(time_limit_s=time_limit_s)
    status = interrupt.solve(solver, model)
    model.clear_assumptions()
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    for index in range(len(model.proto.variables)):
        var = model.get_int_var_from_proto_index(index)
        model.add_hint(var, solver.value(var))
    return True
