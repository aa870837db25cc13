"""Why this layout (issue 24): the fastest layout with each axis changed, and the optimum a given
layout is measured against (types in ``autopar.layout.alternatives``).

Exact and cheap first: every layout the rules allow is scored (``autopar.costs.score``, which
keeps the fastest fitting layout and the least memory of every value of every axis: 64,590
layouts for Llama-3 70B on 1,024 GPUs, 890,334 for DeepSeek-V3 on 2,048, under a second), so
each axis's answer is the true fastest fitting layout with that axis changed, ties broken as
the solver breaks them (whole microseconds, then ``tie_key``). When the time limit ends scoring
first, every axis is marked ``cut short``: scoring stops only once the deadline has passed
(``autopar.base.deadline``), so no time is left for any other search (the CP-SAT re-solve per
axis that used to follow always got none, and was removed).
"""

from __future__ import annotations

import time

from autopar.base.axes import AXIS, FREE_AXES
from autopar.costs.estimate import estimate_many
from autopar.costs.score import Scores, score_space, scored_order
from autopar.costs.terms import CostModel, TermContext
from autopar.layout.alternatives import Alternative, Alternatives, Optimum
from autopar.layout.plan import Estimate, Layout
from autopar.layout.space import Space


def _scores(
    space: Space, ctx: TermContext, cm: CostModel, deadline: float, scored: Scores | None = None
) -> Scores | None:
    """Every layout of ``space`` scored, each axis value's best kept (``scored``, when the
    search already scored them so, even once the deadline has passed: they cost nothing more);
    None when the deadline ends the scoring first."""
    if scored is not None and scored.complete and scored.by_axis:
        return scored
    if time.perf_counter() >= deadline:
        return None
    scores = score_space(space, ctx, cm, by_axis=True, deadline=deadline)
    return scores if scores.complete else None


def _axes(space: Space) -> list[str]:
    """The axes a layout is chosen by that the problem leaves more than one value."""
    return [a for a in FREE_AXES if len(space.domains[a]) > 1]


def _found(axis: str, chosen: Estimate, estimate: Estimate) -> Alternative:
    grows = max(estimate.time_s, key=lambda k: estimate.time_s[k] - chosen.time_s.get(k, 0.0))
    return Alternative(
        axis=axis,
        chosen=getattr(chosen.layout, AXIS[axis].layout_attr),
        outcome="found",
        estimate=estimate,
        slowdown=estimate.step_time_s / chosen.step_time_s - 1.0,
        grows=grows,
    )


def _by_enumeration(scores: Scores, space, ctx, cm, chosen: Estimate) -> list[Alternative]:
    row = chosen.layout.grid_row()
    rows: dict[str, dict[str, int]] = {}
    out: dict[str, Alternative] = {}
    for axis in _axes(space):
        others = [s for v, s in scores.by_axis.get(axis, {}).items() if v != row[axis]]
        if others:
            rows[axis] = min(others, key=scored_order).row
            continue
        value = getattr(chosen.layout, AXIS[axis].layout_attr)
        lows = [m for v, m in scores.least_by_axis.get(axis, {}).items() if v != row[axis]]
        if not lows:  # the rules leave this problem's layouts this one value
            out[axis] = Alternative(axis=axis, chosen=value, outcome="none allowed")
            continue
        out[axis] = Alternative(
            axis=axis, chosen=value, outcome="none fits", min_memory_bytes=float(min(lows))
        )
    layouts = [Layout.from_grid_row(r) for r in rows.values()]
    for axis, estimate in zip(rows, estimate_many(layouts, ctx, cm), strict=True):
        out[axis] = _found(axis, chosen, estimate)
    return [out[a] for a in _axes(space) if a in out]


def _cut_short(space: Space, chosen: Estimate) -> list[Alternative]:
    """Every axis, when the deadline passed before scoring covered the space."""
    return [
        Alternative(axis=a, chosen=getattr(chosen.layout, AXIS[a].layout_attr), outcome="cut short")
        for a in _axes(space)
    ]


def find_alternatives(
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    chosen: Estimate,
    *,
    deadline: float,
    scores: Scores | None = None,
) -> Alternatives:
    """For each axis of ``space`` with more than one value, the fastest fitting layout whose
    value of that axis differs from ``chosen``'s (module docstring: how, and at what cost).
    ``scores``: the search's own scoring of ``space`` by step time with ``by_axis``
    (``autopar.search.solver.solve_scored``), read instead of scoring it again."""
    start = time.perf_counter()
    scores = _scores(space, ctx, cost_model, deadline, scores)
    if scores is None:
        items, count = _cut_short(space, chosen), None
    else:
        items, count = _by_enumeration(scores, space, ctx, cost_model, chosen), scores.layouts
    return Alternatives(
        chosen=chosen,
        items=tuple(items),
        method="enumeration",
        layouts=count,
        time_s=time.perf_counter() - start,
    )


def find_optimum(
    space: Space, ctx: TermContext, cost_model: CostModel, given: Estimate, *, deadline: float
) -> Optimum | None:
    """The fastest fitting layout of ``space`` and ``given``'s gap to it; None when nothing fits
    or the deadline passes before every layout is scored."""
    start = time.perf_counter()
    scores = _scores(space, ctx, cost_model, deadline)
    if scores is None or not scores.best:
        return None
    (best,) = estimate_many([Layout.from_grid_row(scores.best[0].row)], ctx, cost_model)
    return Optimum(
        estimate=best,
        gap=given.step_time_s / best.step_time_s - 1.0,
        proven=True,
        method="enumeration",
        layouts=scores.layouts,
        time_s=time.perf_counter() - start,
    )
