"""Run CP-SAT on a space: the optimum, the runners-up, and the status (DESIGN §3).

Determinism: the optimum's objective value is unique. The best layouts are then enumerated with
a single worker under an objective bound (``objective <= optimum * (1 + slack)``, the slack
widened until ``top_k`` layouts are in, DESIGN §3 "enumerate under an objective bound") and
ordered by objective, then ``autopar.base.axes.tie_key`` (smaller tp, then pp, cp, ep, etp, vpp;
larger micro-batch; less recompute; lower ZeRO stage), so the same input gives the same answer
and order whatever the worker count. Results are distinct layouts, best first.

This module only searches: when nothing fits, the caller (``autopar.api``) asks
``autopar.search.explain`` why.
"""

from __future__ import annotations

import os
import time

from ortools.sat.python import cp_model

from autopar.base.axes import tie_key
from autopar.base.deadline import TimeLimitReached
from autopar.costs.estimate import estimate_many
from autopar.costs.terms import CostModel, CostTerm, TermContext
from autopar.layout.plan import Layout
from autopar.layout.results import SolveResult
from autopar.layout.space import Space
from autopar.search import interrupt
from autopar.search.cpsat import US_PER_S, VarMap, build_model, make_solver

MAX_TIES = 64
"""Enumerations for the runners-up stop at max(MAX_TIES, 8 * top_k) layouts."""
TOP_K_SLACK = 0.005
"""First enumeration bound for the runners-up: objective <= optimum * (1 + 0.5%)."""
TOP_K_MAX_SLACK = 64.0
"""Runners-up slower than 65x the optimum are not looked for."""


def default_num_workers() -> int:
    """CP-SAT's portfolio needs 8 workers for parallel search; fewer cores than that make the
    extra workers pure overhead (benchmarks/solve_scaling.py measures it)."""
    return max(1, min(8, os.cpu_count() or 1))


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
) -> list[dict[str, int]]:
    """The ``top_k`` best layouts (fewer only when fewer exist within 65x the optimum).

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
    return [row for _, row in (ranked + extra)[:top_k]]


def _optimise(model, vm, *, time_limit_s, num_workers):
    model.minimize(vm.objective)
    solver = make_solver(time_limit_s=time_limit_s, num_workers=num_workers)
    status = interrupt.solve(solver, model)
    return solver, status


def _layouts_from_rows(rows: list[dict[str, int]]) -> list[Layout]:
    return [Layout.from_grid_row(row) for row in rows]


def solve_space(
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    top_k: int = 1,
    time_limit_s: float = 10.0,
    num_workers: int | None = None,
    time_factor: CostTerm | None = None,
    upper_bound_s: float | None = None,
) -> SolveResult:
    """Minimise the cost model's step time over the layouts of ``space`` (with
    ``time_factor``, the step time times it: the expected time per useful step,
    ``autopar.costs.goodput``); with ``upper_bound_s``, only layouts whose objective is at most
    that are looked at. When nothing fits, the status is ``infeasible`` (proven) or ``unknown``
    (time out), with no explanation."""
    start = time.perf_counter()
    workers = num_workers or default_num_workers()
    deadline = start + time_limit_s
    if not all(space.domains.values()):  # a rule, pin or limit leaves an axis no value
        return _no_solution("infeasible", start, workers)
    try:
        model, vm = build_model(space, cost_model, ctx, deadline=deadline, time_factor=time_factor)
    except TimeLimitReached:  # the time limit ran out while the model was being built
        return _no_solution("unknown", start, workers)
    if upper_bound_s is not None:
        # Only layouts at least as good as the bound (a caller's incumbent elsewhere).
        model.add(vm.objective <= int(upper_bound_s * US_PER_S))
    left = max(0.0, deadline - time.perf_counter())
    solver, status = _optimise(model, vm, time_limit_s=left, num_workers=workers)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _no_solution(
            "infeasible" if status == cp_model.INFEASIBLE else "unknown", start, workers
        )
    incumbent = {a: int(solver.value(v)) for a, v in vm.axes.items()}
    if status == cp_model.OPTIMAL:
        optimum = int(round(solver.objective_value))
        rows = _best_k(model, vm, optimum, top_k, deadline) or [incumbent]
    else:
        rows = [incumbent]  # not proven: no ranking of runners-up to stand behind
    estimates = estimate_many(_layouts_from_rows(rows), ctx, cost_model)
    cut = len(rows) < top_k and time.perf_counter() >= deadline
    return SolveResult(
        status="optimal" if status == cp_model.OPTIMAL else "feasible",
        solve_time_s=time.perf_counter() - start,
        layouts=tuple(estimates),
        best_bound_step_time_s=solver.best_objective_bound / US_PER_S,
        num_workers=workers,
        objective="step-time" if time_factor is None else "goodput",
        notes=(f"the time limit cut the runners-up short ({len(rows)} of {top_k})",) if cut else (),
    )


def _no_solution(status: str, start: float, workers: int) -> SolveResult:
    return SolveResult(
        status=status,
        solve_time_s=time.perf_counter() - start,
        layouts=(),
        num_workers=workers,
    )
