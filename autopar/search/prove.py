"""CP-SAT's proof of the uniform space (DESIGN §3), when asked (``method="cp-sat"``; the default
``auto`` scores every layout and, when the time limit strikes first, answers the best scored,
not proven): the optimum, the runners-up and the status, every variable hinted to the best
layout scored. Imported only then, so a solve that scoring answers never loads OR-Tools (nor
pandas, which OR-Tools loads).

Determinism: the optimum's objective value is unique. The best layouts are then enumerated with
a single worker under an objective bound (``objective <= optimum * (1 + slack)``, the slack
widened until ``top_k`` layouts are in, DESIGN §3 "enumerate under an objective bound") and
ordered by objective, then ``autopar.base.axes.tie_key`` (smaller tp, then pp, cp, ep, etp, vpp;
larger micro-batch; less recompute; lower ZeRO stage), so the same input gives the same answer
and order whatever the worker count. Results are distinct layouts, best first.
"""

from __future__ import annotations

import time

import numpy as np
from ortools.sat.python import cp_model

from autopar.base.axes import tie_key
from autopar.base.deadline import TimeLimitReached
from autopar.costs.estimate import estimate_many
from autopar.layout.results import Proof, SolveResult
from autopar.search import interrupt
from autopar.search.answers import hinted, layouts_from_rows, no_solution
from autopar.search.cpsat import US_PER_S, VarMap, build_model, make_solver

MAX_TIES = 64
"""Enumerations for the runners-up stop at max(MAX_TIES, 8 * top_k) layouts."""
TOP_K_SLACK = 0.005
"""First enumeration bound for the runners-up: objective <= optimum * (1 + 0.5%)."""
TOP_K_MAX_SLACK = 64.0
"""Runners-up slower than 65x the optimum are not looked for."""
EXACT_SLACK_US = 2
"""A layout's step and its objective agree within the objective's rounding to microseconds."""
EXACT_LIMIT = 4096
"""Layouts estimated, at most, to find the best step when the objective bounds it from below."""
EXACT_CUT_NOTE = (
    "not proven: a schedule's objective is a lower bound of its simulated step, and the "
    "layouts it leaves in reach were too many to simulate in time"
)


class _Collector(cp_model.CpSolverSolutionCallback):
    """Each solution's layout and integer objective, up to ``limit`` solutions."""

    def __init__(self, vm: VarMap, limit: int) -> None:
        super().__init__()
        self._vm, self._limit = vm, limit
        self.found: list[tuple[int, dict[str, int]]] = []

    def on_solution_callback(self) -> None:
        row = {a: int(self.value(v)) for a, v in self._vm.axes.items()}
        self.found.append((int(self.value(self._vm.objective)), row))
        if len(self.found) >= self._limit:
            self.stop_search()


def _within(
    model: cp_model.CpModel, vm: VarMap, bound: int, *, limit: int, time_limit_s: float
) -> tuple[list[tuple[int, dict[str, int]]], bool]:
    """Every layout whose objective is at most ``bound`` (one worker, so the enumeration is
    deterministic), and whether the enumeration completed (not cut at ``limit`` or by time)."""
    model.clear_objective()
    within = model.new_bool_var(f"objective<={bound}")
    model.add(vm.objective <= bound).only_enforce_if(within)
    model.clear_assumptions()
    model.add_assumptions([within])
    solver = make_solver(time_limit_s=time_limit_s)
    solver.parameters.enumerate_all_solutions = True
    collector = _Collector(vm, limit)
    status = interrupt.solve(solver, model, collector)
    model.clear_assumptions()
    model.add(within == 0)  # retire this bound; the model is reused for the next one
    complete = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE) and len(collector.found) < limit
    return collector.found, complete


def _best_k(
    model: cp_model.CpModel, vm: VarMap, optimum: int, top_k: int, deadline: float
) -> list[tuple[int, dict[str, int]]]:
    """The ``top_k`` best layouts with their objectives (fewer only when fewer exist within
    65x the optimum).

    Enumerate every layout within a bound of the proven optimum: widen the bound (x4 slack)
    while the enumeration completes with fewer than ``top_k``; once one overflows (more than
    ``limit`` layouts, enumerated in no useful order), bisect between the last complete bound
    and the overflowing one until an enumeration completes with ``top_k`` or more. Order by
    objective, then ``tie_key``. When time runs out mid-bisection, the complete layouts come
    first and the overflowing enumeration's best fill the rest.
    """
    limit = max(MAX_TIES, 8 * top_k)
    low, high = optimum - 1, None  # all layouts <= low are known (none below the optimum)
    known: list[tuple[int, dict[str, int]]] = []
    overflow: list[tuple[int, dict[str, int]]] = []
    slack = TOP_K_SLACK
    for _ in range(40):
        widening = high is None
        bound = optimum + max(1, int(optimum * slack)) if widening else (low + high) // 2
        left = deadline - time.perf_counter()
        if left <= 0 or (high is not None and bound <= low):
            break
        found, complete = _within(model, vm, bound, limit=limit, time_limit_s=left)
        if complete:
            low, known = bound, found
            if len(found) >= top_k or (high is None and slack >= TOP_K_MAX_SLACK):
                break
            slack *= 4
        else:
            high, overflow = bound, found
    ranked = sorted(known, key=lambda f: (f[0], tie_key(f[1])))
    seen = {tuple(row.values()) for _, row in ranked}
    extra = sorted(
        (f for f in overflow if tuple(f[1].values()) not in seen),
        key=lambda f: (f[0], tie_key(f[1])),
    )
    return (ranked + extra)[:top_k]


def _exact_best(reach, found, estimates: list, top_k: int, ctx, cost_model) -> tuple[list, bool]:
    """The ``top_k`` best layouts by their own step time when the objective is a lower bound
    of it (a zero-bubble or DualPipe schedule's slots at reference phase times:
    ``autopar.search.cpsat._slotted_part``). Every layout whose objective reaches the k-th best
    step found is enumerated and estimated with each schedule its rules allow (the fused table
    keeps one per outer layout: ``autopar.search.cpsat.FOLDED``), and those that fit kept
    (the table keeps a schedule that fits; another schedule of the same outer layout may hold
    more activations): a layout left out has objective, hence step time, above it. Returns the
    estimates and whether the enumeration completed."""
    steps_us = [int(np.ceil(e.step_time_s * US_PER_S)) for e in estimates]
    if all(step <= obj + EXACT_SLACK_US for (obj, _), step in zip(found, steps_us, strict=True)):
        return estimates, True
    model, vm, space, deadline = reach
    bound = sorted(steps_us)[min(top_k, len(steps_us)) - 1]
    left = deadline - time.perf_counter()
    rows, complete = _within(model, vm, bound, limit=EXACT_LIMIT, time_limit_s=max(0.0, left))
    candidates = {tuple(r.items()): r for r in _with_each_schedule(space, [*found, *rows])}
    estimated = estimate_many(layouts_from_rows(list(candidates.values())), ctx, cost_model)
    everything = [e for e in estimated if e.fits]
    everything.sort(key=lambda e: (e.step_time_s, tie_key(e.layout.grid_row())))
    return _distinct_outer(everything)[:top_k], complete


def _with_each_schedule(space, found) -> list[dict[str, int]]:
    """Each found layout with every schedule of the space its rules allow."""
    out = []
    for _, row in found:
        for code in space.domains["schedule"]:
            other = {**row, "schedule": code}
            if space.broken_rule(other) is None:
                out.append(other)
    return out


def _distinct_outer(estimates: list) -> list:
    """The best schedule of each outer layout (the fused table's runners-up are distinct in
    their other axes: ``autopar.search.cpsat.FOLDED``)."""
    seen, out = set(), []
    for e in estimates:
        key = tuple((a, v) for a, v in e.layout.grid_row().items() if a != "schedule")
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _optimise(model, vm, *, time_limit_s, num_workers):
    model.minimize(vm.objective)
    solver = make_solver(time_limit_s=time_limit_s, num_workers=num_workers)
    status = interrupt.solve(solver, model)
    return solver, status


def prove(
    space, ctx, cost_model, hint, start, deadline, workers, top_k, cover, goal
) -> SolveResult:
    """CP-SAT over ``space``, every variable hinted to ``hint`` (a ``Scored`` layout that fits,
    or ``None``); the hint is the answer when CP-SAT finds nothing better in time."""
    proof = Proof(method="cp-sat", coverage=cover)
    try:
        model, vm = build_model(
            space,
            cost_model,
            ctx,
            deadline=deadline,
            time_factor=goal.time_factor,
            hint_row=hint.row if hint else None,
        )
    except TimeLimitReached:  # the time limit ran out while the model was being built
        return hinted(hint, ctx, cost_model, start, workers, proof, bound=None, goal=goal)
    if goal.upper_bound_s is not None:
        # Only layouts at least as good as the bound (a caller's incumbent elsewhere).
        model.add(vm.objective <= int(goal.upper_bound_s * US_PER_S))
    left = max(0.0, deadline - time.perf_counter())
    solver, status = _optimise(model, vm, time_limit_s=left, num_workers=workers)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.INFEASIBLE:
            return no_solution("infeasible", start, workers, proof)
        return hinted(hint, ctx, cost_model, start, workers, proof, bound=None, goal=goal)
    incumbent = {a: int(solver.value(v)) for a, v in vm.axes.items()}
    bound = solver.best_objective_bound / US_PER_S
    found = [(int(round(solver.objective_value)), incumbent)]
    if status == cp_model.OPTIMAL:
        found = _best_k(model, vm, found[0][0], top_k, deadline) or found
    elif hint is not None and hint.step_us < found[0][0]:
        return hinted(hint, ctx, cost_model, start, workers, proof, bound=bound, goal=goal)
    # not proven: no ranking of runners-up to stand behind
    estimates = estimate_many(layouts_from_rows([r for _, r in found]), ctx, cost_model)
    notes = []
    if len(found) < top_k and time.perf_counter() >= deadline:
        notes.append(f"the time limit cut the runners-up short ({len(found)} of {top_k})")
    proven = status == cp_model.OPTIMAL
    if proven and goal.time_factor is None:
        reach = (model, vm, space, deadline)
        estimates, proven = _exact_best(reach, found, estimates, top_k, ctx, cost_model)
        if not proven:
            notes.append(EXACT_CUT_NOTE)
    return SolveResult(
        status="optimal" if proven else "feasible",
        solve_time_s=time.perf_counter() - start,
        layouts=tuple(estimates),
        best_bound_step_time_s=bound,
        num_workers=workers,
        objective=goal.name,
        notes=tuple(notes),
        proof=proof,
    )
