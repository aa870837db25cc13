"""Search a space: the optimum, the runners-up, and the status (DESIGN §3).

Every layout of the uniform space is scored first (``autopar.costs.score``: each term once on its
own axes, joined in numpy), which is exact and takes a fraction of a second for the spaces of
real jobs (``benchmarks/solve_scaling.py``): the best scored layout is the optimum by
enumeration, the runners-up in order (step time to the microsecond, then
``autopar.base.axes.tie_key``). Scoring stops only once the time limit has passed, so when it
cannot finish the answer is the best layout scored so far, ``feasible`` and not proven (no time
is left for CP-SAT). CP-SAT proves the optimum when asked (``method="cp-sat"``: the oracle tests
check both against brute force), seeded with the best layout scored, if any
(``autopar.search.prove``, imported only then).

This module only searches: when nothing fits, the caller (``autopar.api``) asks
``autopar.search.explain`` why.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numpy as np

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.costs.error_bands import ErrorBand
from autopar.costs.estimate import estimate_many
from autopar.costs.schedule_slots import CLOSED_FORMS
from autopar.costs.score import Scored, Scores, score_space, sorted_scored
from autopar.costs.terms import CostModel, CostTerm, TermContext
from autopar.layout.coverage import Coverage
from autopar.layout.results import HEADROOM_FILL, Proof, SolveResult, Ties
from autopar.layout.space import Space
from autopar.search.answers import Goal, hinted, layouts_from_rows, no_solution
from autopar.search.exact import CLOSE_FIRST, NOT_CLOSED, Objective, close, needs_closing

SIZED_LIMIT_BASE_S = 10.0
SIZED_LIMIT_PER_LAYOUT_S = 2e-4
"""A limit the user does not set is sized from the problem (``sized_time_limit_s``): 10 s plus
0.2 ms per layout of the uniform space. Scoring takes 1-5 us a layout; the per-stage search,
whose outer layouts are these, took 14.6 s for DeepSeek-V3's 890k on a loaded 2-core machine
(0.02 ms each) and its bounds grow with the rows they keep."""
SIZED_LIMIT_MAX_S = 600.0


def sized_time_limit_s(layouts: int) -> float:
    """The time limit of a problem whose uniform space holds ``layouts`` layouts, when the
    user sets none (``SIZED_LIMIT_PER_LAYOUT_S``)."""
    return min(SIZED_LIMIT_MAX_S, SIZED_LIMIT_BASE_S + SIZED_LIMIT_PER_LAYOUT_S * layouts)


def default_num_workers() -> int:
    """CP-SAT's portfolio needs 8 workers for parallel search; fewer cores than that make the
    extra workers pure overhead (benchmarks/solve_scaling.py measures it)."""
    return max(1, min(8, os.cpu_count() or 1))


def solve_space(
    space: Space, ctx: TermContext, cost_model: CostModel, **options: Any
) -> SolveResult:
    """``solve_scored``'s result alone (the same keywords)."""
    result, _ = solve_scored(space, ctx, cost_model, **options)
    return result


def solve_scored(
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
    by_axis: bool = False,
) -> tuple[SolveResult, Scores | None]:
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
    ties (``SolveResult.ties``); ``prefer="headroom"`` ranks them first by ``PREFERENCE``.

    Also returned: the scores when every layout was scored (else None); with ``by_axis`` they
    keep each axis value's best (``score_space``), which "why this layout" reads
    (``autopar.search.alternatives.find_alternatives``) instead of scoring the space again."""
    start = time.perf_counter()
    workers = num_workers or default_num_workers()
    deadline = None if time_limit_s is None else start + time_limit_s
    cover = coverage or Coverage(framework=ctx.options.framework)
    if not all(space.domains.values()):  # a rule, pin or limit leaves an axis no value
        proof = Proof(method="rules", coverage=cover)
        return no_solution("infeasible", start, workers, proof), None
    goal = Goal(time_factor=time_factor, upper_bound_s=upper_bound_s)
    scores = None
    if method in ("auto", "enumerate"):
        rel = band.rel_error if band is not None else 0.0
        closed = all(
            PIPELINE_SCHEDULES[c] in CLOSED_FORMS for c in space.domains.get("schedule", (0,))
        )
        asked = top_k if closed else max(top_k, CLOSE_FIRST)

        def scored(bound_s: float | None, top: int, *, per_axis: bool = False) -> Scores:
            limits = [b for b in (bound_s, upper_bound_s) if b is not None and np.isfinite(b)]
            return score_space(
                space,
                ctx,
                cost_model,
                top=top,
                band=rel,
                deadline=deadline,
                time_factor=time_factor,
                upper_bound_s=min(limits) if limits else None,
                by_axis=per_axis,
            )

        scores = scored(None, asked, per_axis=by_axis)
        proven = True
        if scores.complete and needs_closing(scores, top_k):
            # a schedule's score is a lower bound of its simulated step: close it
            # (autopar.search.exact); the rescoring keeps no per-axis bests
            objective = Objective(ctx=ctx, cost_model=cost_model, goal=goal)
            scores, proven = close(scores, scored, objective, top_k=top_k, asked=asked, band=rel)
        if scores.complete:
            tied = (band, prefer)
            result = _enumerated(scores, ctx, cost_model, start, workers, top_k, cover, tied, goal)
            if not proven and result.layouts:
                notes = (*result.notes, NOT_CLOSED)
                result = dataclasses.replace(result, status="feasible", notes=notes)
            return result, scores
    hint = scores.best[0] if scores and scores.best else None
    if deadline is not None and time.perf_counter() >= deadline:
        # the limit struck while scoring: no time is left for CP-SAT (nor its 0.8 s import)
        proof = Proof(method="cp-sat", coverage=cover)
        return hinted(hint, ctx, cost_model, start, workers, proof, bound=None, goal=goal), None
    if deadline is None:  # no limit given: CP-SAT's is sized from the problem
        deadline = start + sized_time_limit_s(scores.layouts if scores else 0)
    from autopar.search.prove import prove  # OR-Tools: loaded only when CP-SAT runs

    result = prove(space, ctx, cost_model, hint, start, deadline, workers, top_k, cover, goal)
    return result, None


def _enumerated(scores, ctx, cost_model, start, workers, top_k, cover, tied_by, goal):
    """The answer of a complete scoring: the best rows in order, the ties of the band marked
    and the preferred tie among them (``tied_by``: the band and the preference; the preferred
    tie first with ``prefer="headroom"``)."""
    band, prefer = tied_by
    proof = Proof(method="enumeration", coverage=cover, layouts=scores.layouts)
    if not scores.best:
        return no_solution("infeasible", start, workers, proof)
    rows = [item.row for item in scores.best[:top_k]]
    capacity = float(ctx.cluster.usable_memory_bytes)
    tied = sorted_scored(scores.within_band, _preference(capacity)) if band is not None else []
    if tied and prefer == "headroom":
        first = [item.row for item in tied[:top_k]]
        rows = (first + [row for row in rows if row not in first])[:top_k]
    shown = tied[0].row if tied and prefer == "fastest" else scores.best[0].row
    if shown not in rows and top_k > 1:
        rows[-1] = shown  # the preferred tie, or the fastest, is always among the layouts
    # the fastest and the preferred tie: the rows' estimates, or estimated in the same
    # (vectorised) call when they are not among the rows
    pair = [scores.best[0].row, tied[0].row] if tied else []
    missing = [row for row in pair if row not in rows]
    estimated = estimate_many(layouts_from_rows(rows + missing), ctx, cost_model)
    estimates = tuple(estimated[: len(rows)])
    extra = [estimated[(rows + missing).index(row)] for row in pair]
    ties = None
    if tied:
        within = {tuple(item.row.items()) for item in tied}
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

    def key(item: Scored) -> tuple:  # then tie_key (sorted_scored)
        row = item.row
        roomy = item.memory_bytes <= HEADROOM_FILL * capacity_bytes
        return (not roomy, item.step_us, row["tp"] * row["cp"] * row["pp"])

    return key
