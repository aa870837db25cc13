"""Search a space: the optimum, the runners-up, and the status (DESIGN §3).

Every layout of the uniform space is scored first (``autopar.costs.score``: each term once on its
own axes, joined in numpy), which is exact and takes a fraction of a second for the spaces of
real jobs (``benchmarks/solve_scaling.py``): the best scored layout is the optimum by
enumeration. CP-SAT proves the optimum when scoring cannot finish within the time limit (or
when asked, ``method="cp-sat"``: the oracle tests check both against brute force), seeded with
the best layout scored so far.

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
from dataclasses import dataclass

from ortools.sat.python import cp_model

from autopar.base.axes import tie_key
from autopar.base.deadline import TimeLimitReached
from autopar.costs.error_bands import ErrorBand
from autopar.costs.estimate import estimate_many
from autopar.costs.score import Scored, score_space
from autopar.costs.terms import CostModel, CostTerm, TermContext
from autopar.layout.coverage import Coverage
from autopar.layout.plan import Layout
from autopar.layout.results import HEADROOM_FILL, Proof, SolveResult, Ties
from autopar.layout.space import Space
from autopar.search import interrupt
from autopar.search.cpsat import US_PER_S, VarMap, build_model, make_solver

SIZED_LIMIT_BASE_S = 10.0
SIZED_LIMIT_PER_LAYOUT_S = 2e-4
"""A limit the user does not set is sized from the problem (``sized_time_limit_s``): 10 s plus
0.2 ms per layout of the uniform space. Scoring takes 1-5 us a layout; the per-stage search,
whose outer layouts are these, took 14.6 s for DeepSeek-V3's 890k on a loaded 2-core machine
(0.02 ms each) and its bounds grow with the rows they keep."""
SIZED_LIMIT_MAX_S = 600.0
MAX_TIES = 64
"""Enumerations for the runners-up stop at max(MAX_TIES, 8 * top_k) layouts."""
TOP_K_SLACK = 0.005
"""First enumeration bound for the runners-up: objective <= optimum * (1 + 0.5%)."""
TOP_K_MAX_SLACK = 64.0
"""Runners-up slower than 65x the optimum are not looked for."""


def sized_time_limit_s(layouts: int) -> float:
    """The time limit of a problem whose uniform space holds ``layouts`` layouts, when the
    user sets none (``SIZED_LIMIT_PER_LAYOUT_S``)."""
    return min(SIZED_LIMIT_MAX_S, SIZED_LIMIT_BASE_S + SIZED_LIMIT_PER_LAYOUT_S * layouts)


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


@dataclass(frozen=True, slots=True)
class Goal:
    """What the search minimises: the step time, or with ``time_factor`` the step time times it
    (the expected time per useful step, ``autopar.costs.goodput``); with ``upper_bound_s``, only
    layouts whose objective is at most that."""

    time_factor: CostTerm | None = None
    upper_bound_s: float | None = None

    @property
    def name(self) -> str:
        return "step-time" if self.time_factor is None else "goodput"


def solve_space(
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    top_k: int = 1,
    time_limit_s: float | None = 10.0,
    num_workers: int | None = None,
    time_factor: CostTerm | None = None,
    upper_bound_s: float | None = None,
    method: str = "auto",
    coverage: Coverage | None = None,
    band: ErrorBand | None = None,
    prefer: str = "fastest",
) -> SolveResult:
    """Minimise the cost model's step time over the layouts of ``space`` (with
    ``time_factor``, the step time times it: the expected time per useful step,
    ``autopar.costs.goodput``); with ``upper_bound_s``, only layouts whose objective is at most
    that are looked at. When nothing fits, the status is ``infeasible`` (proven) or ``unknown``
    (time out), with no explanation.

    ``method``: ``enumerate`` scores every layout (``autopar.costs.score``: exact, and its best
    layout is the optimum by enumeration); ``cp-sat`` proves it with CP-SAT, seeded with the
    best layout scoring found (a whole feasible hint: when the limit strikes, the best found is
    the answer, with CP-SAT's bound and gap); ``auto`` enumerates and falls back to CP-SAT only
    when the deadline ends scoring early (``time_limit_s=None``: scoring runs to the end, and
    CP-SAT's limit is ``sized_time_limit_s``). ``coverage`` is what the proof covers. With ``band``
    (the cost model's error band of this class), the layouts within it of the fastest are
    ties (``SolveResult.ties``); ``prefer="headroom"`` ranks them first by ``PREFERENCE``."""
    start = time.perf_counter()
    workers = num_workers or default_num_workers()
    deadline = None if time_limit_s is None else start + time_limit_s
    cover = coverage or Coverage(framework=ctx.options.framework)
    if not all(space.domains.values()):  # a rule, pin or limit leaves an axis no value
        return _no_solution("infeasible", start, workers, Proof(method="rules", coverage=cover))
    goal = Goal(time_factor=time_factor, upper_bound_s=upper_bound_s)
    scores = None
    if method in ("auto", "enumerate"):
        rel = band.rel_error if band is not None else 0.0
        scores = score_space(
            space,
            ctx,
            cost_model,
            top=top_k,
            band=rel,
            deadline=deadline,
            time_factor=time_factor,
            upper_bound_s=upper_bound_s,
        )
        if scores.complete:
            tied = (band, prefer)
            return _enumerated(scores, ctx, cost_model, start, workers, top_k, cover, tied, goal)
    hint = scores.best[0] if scores and scores.best else None
    if deadline is None:  # no limit given: CP-SAT's is sized from the problem
        deadline = start + sized_time_limit_s(scores.layouts if scores else 0)
    return _cpsat(space, ctx, cost_model, hint, start, deadline, workers, top_k, cover, goal)


def _enumerated(scores, ctx, cost_model, start, workers, top_k, cover, tied_by, goal):
    """The answer of a complete scoring: the best rows in order, the ties of the band marked
    and the preferred tie among them (``tied_by``: the band and the preference; the preferred
    tie first with ``prefer="headroom"``)."""
    band, prefer = tied_by
    proof = Proof(method="enumeration", coverage=cover, layouts=scores.layouts)
    if not scores.best:
        return _no_solution("infeasible", start, workers, proof)
    rows = [item.row for item in scores.best[:top_k]]
    capacity = float(ctx.cluster.usable_memory_bytes)
    tied = sorted(scores.within_band, key=_preference(capacity)) if band is not None else []
    if tied and prefer == "headroom":
        first = [item.row for item in tied[:top_k]]
        rows = (first + [row for row in rows if row not in first])[:top_k]
    shown = tied[0].row if tied and prefer == "fastest" else scores.best[0].row
    if shown not in rows and top_k > 1:
        rows[-1] = shown  # the preferred tie, or the fastest, is always among the layouts
    estimates = tuple(estimate_many(_layouts_from_rows(rows), ctx, cost_model))
    ties = None
    if tied:
        within = {tuple(item.row.items()) for item in tied}
        extra = estimate_many(
            _layouts_from_rows([scores.best[0].row, tied[0].row]), ctx, cost_model
        )
        ties = Ties(
            rel_error=band.rel_error,
            band=band.text(),
            count=len(tied),
            tied=tuple(i for i, row in enumerate(rows) if tuple(row.items()) in within),
            fastest=extra[0],
            preferred=extra[1],
            prefer=prefer,
            fastest_index=rows.index(scores.best[0].row) if scores.best[0].row in rows else None,
            preferred_index=rows.index(tied[0].row) if tied[0].row in rows else None,
        )
    return SolveResult(
        status="optimal",
        solve_time_s=time.perf_counter() - start,
        layouts=estimates,
        best_bound_step_time_s=scores.best[0].step_s,
        num_workers=workers,
        objective=goal.name,
        proof=proof,
        ties=ties,
    )


def _preference(capacity_bytes: float):
    """``PREFERENCE``: within ``HEADROOM_FILL`` of the usable memory, then fastest, then fewest
    GPUs per model replica, then the search's own order."""

    def key(item: Scored) -> tuple:
        row = item.row
        roomy = item.memory_bytes <= HEADROOM_FILL * capacity_bytes
        return (not roomy, item.step_us, row["tp"] * row["cp"] * row["pp"], tie_key(row))

    return key


def _cpsat(
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
        return _hinted(hint, ctx, cost_model, start, workers, proof, bound=None, goal=goal)
    if goal.upper_bound_s is not None:
        # Only layouts at least as good as the bound (a caller's incumbent elsewhere).
        model.add(vm.objective <= int(goal.upper_bound_s * US_PER_S))
    left = max(0.0, deadline - time.perf_counter())
    solver, status = _optimise(model, vm, time_limit_s=left, num_workers=workers)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.INFEASIBLE:
            return _no_solution("infeasible", start, workers, proof)
        return _hinted(hint, ctx, cost_model, start, workers, proof, bound=None, goal=goal)
    incumbent = {a: int(solver.value(v)) for a, v in vm.axes.items()}
    bound = solver.best_objective_bound / US_PER_S
    if status == cp_model.OPTIMAL:
        optimum = int(round(solver.objective_value))
        rows = _best_k(model, vm, optimum, top_k, deadline) or [incumbent]
    else:
        best_us = int(round(solver.objective_value))
        if hint is not None and hint.step_us < best_us:
            return _hinted(hint, ctx, cost_model, start, workers, proof, bound=bound, goal=goal)
        rows = [incumbent]  # not proven: no ranking of runners-up to stand behind
    estimates = estimate_many(_layouts_from_rows(rows), ctx, cost_model)
    cut = len(rows) < top_k and time.perf_counter() >= deadline
    return SolveResult(
        status="optimal" if status == cp_model.OPTIMAL else "feasible",
        solve_time_s=time.perf_counter() - start,
        layouts=tuple(estimates),
        best_bound_step_time_s=bound,
        num_workers=workers,
        objective=goal.name,
        notes=(f"the time limit cut the runners-up short ({len(rows)} of {top_k})",) if cut else (),
        proof=proof,
    )


def _hinted(hint, ctx, cost_model, start, workers, proof, *, bound, goal) -> SolveResult:
    """The hint as the answer when the time limit struck before CP-SAT bettered it."""
    if hint is None:
        return _no_solution("unknown", start, workers, proof)
    return SolveResult(
        status="feasible",
        solve_time_s=time.perf_counter() - start,
        layouts=tuple(estimate_many(_layouts_from_rows([hint.row]), ctx, cost_model)),
        best_bound_step_time_s=bound,
        num_workers=workers,
        objective=goal.name,
        notes=("the time limit struck first: the best layout scored, not proven optimal",),
        proof=proof,
    )


def _no_solution(status: str, start: float, workers: int, proof: Proof | None) -> SolveResult:
    return SolveResult(
        status=status,
        solve_time_s=time.perf_counter() - start,
        layouts=(),
        num_workers=workers,
        proof=proof,
    )
