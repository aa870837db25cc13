"""The per-stage search for a framework whose output takes only some plans
(``autopar.layout.stage_rules``: torchtitan's equal middle chunks and one recompute mode): every
plan those rules allow, scored by the schedule formula on every outer row that can still hold
the optimum, which is then proven by enumeration.

The plans torchtitan takes are few (a middle chunk size, the first chunk's share of what is
left, one of three recompute modes), so they are scored directly, vectorised over the rows of
each pipeline shape, instead of restricting the CP-SAT encodings. The rows' lower bounds
(``autopar.pipeline.candidates``, valid for any plan) order the shapes and rule rows out: a row
whose bound exceeds the ``top``-th best step found so far cannot enter the answer.
"""

from __future__ import annotations

import time

import numpy as np

from autopar.base.axes import GRID_AXES
from autopar.base.deadline import check_deadline
from autopar.costs.stage_estimate import with_plan_recompute
from autopar.costs.stage_figures import stage_totals
from autopar.layout.plan import Layout
from autopar.layout.stage_rules import expressible_plans
from autopar.pipeline.candidates import Candidates
from autopar.pipeline.encoding import PRUNE_TOLERANCE, shapes_of
from autopar.pipeline.solution import StageSolution


def _kth(best_s: np.ndarray, top: int) -> float:
    finite = np.sort(best_s[np.isfinite(best_s)])
    return float(finite[top - 1]) if len(finite) >= top else np.inf


def _score(cand: Candidates, framework: str, top: int, deadline: float | None):
    """Per row: the best step of an allowed plan (``inf`` where none fits or the row was ruled
    out), that plan, and how many rows were scored."""
    ctx, lower = cand.ctx, cand.bounds.lower_s
    best_s = np.full(len(lower), np.inf)
    plans: list = [None] * len(lower)
    shapes = list(shapes_of(cand.grid).items())
    shapes.sort(key=lambda item: float(np.min(lower[item[1]])))
    scored = 0
    for shape, index in shapes:
        check_deadline(deadline)
        kth = _kth(best_s, top)
        bound = lower[index]
        rows = index[np.isfinite(bound) & (bound <= kth * (1 + PRUNE_TOLERANCE) + 1e-12)]
        if not len(rows):
            continue
        scored += len(rows)
        sub, m = ctx.costs.take(rows), ctx.microbatches(rows)
        allowed = expressible_plans(
            framework, ctx.num_layers, shape.pp, shape.vpp, ctx.modes, shape.placement
        )
        for plan in allowed:
            check_deadline(deadline)  # --time-limit covers the plan search (issue 15)
            fig = stage_totals(plan, sub, m, schedule=shape.schedule)
            fits = fig.memory_bytes.max(axis=1) <= ctx.capacity_bytes
            step = np.where(fits, fig.step_time_s, np.inf)
            better = step < best_s[rows]
            for j in np.flatnonzero(better):
                plans[int(rows[j])] = plan
            best_s[rows] = np.where(better, step, best_s[rows])
    return best_s, plans, scored


def solve_expressible_top(
    cand: Candidates, framework: str, *, top: int, start: float, deadline: float | None
) -> list[StageSolution]:
    """The ``top`` best distinct outer layouts, each with its best plan among those
    ``framework`` can write, best first by the formula (``optimal``: every allowed plan of
    every row that could beat them was scored)."""
    build_s = time.perf_counter() - start  # the rows, their costs and bounds
    best_s, plans, scored = _score(cand, framework, top, deadline)
    solve_s = time.perf_counter() - start - build_s  # every allowed plan scored
    order = [int(r) for r in np.argsort(best_s, kind="stable")[:top] if np.isfinite(best_s[r])]
    common = dict(
        rows_total=len(best_s), rows_kept=scored, candidates=cand, build_s=build_s, solve_s=solve_s
    )
    if not order:
        return [
            StageSolution(
                status="infeasible", layout=None, plan=None, step_time_s=None, bound_s=None,
                **common,
            )
        ]  # fmt: skip
    out = []
    for row in order:
        layout = Layout.from_grid_row({a: int(cand.grid[a][row]) for a in GRID_AXES})
        out.append(
            StageSolution(
                status="optimal",
                layout=with_plan_recompute(layout, plans[row]),
                plan=plans[row],
                step_time_s=float(best_s[row]),
                bound_s=float(best_s[row]),
                row=row,
                **common,
            )
        )
    return out
