"""Why this layout (issue 24): the fastest layout with each axis changed, and the optimum a given
layout is measured against (types in ``autopar.layout.alternatives``).

Exact and cheap first: every layout the rules allow is scored (``autopar.costs.score``, which
keeps the fastest fitting layout and the least memory of every value of every axis: 64,590
layouts for Llama-3 70B on 1,024 GPUs, 890,334 for DeepSeek-V3 on 2,048, under a second), so
each axis's answer is the true fastest fitting layout with that axis changed, ties broken as
the solver breaks them (whole microseconds, then ``tie_key``). When the time limit ends scoring
first, each axis gets a CP-SAT re-solve with its chosen value excluded, sharing the time left
evenly; what the time did not cover is marked ``cut short``.
"""

from __future__ import annotations

import dataclasses
import time

from autopar.base.axes import AXIS, FREE_AXES
from autopar.costs.estimate import estimate_many
from autopar.costs.score import Scores, score_space, scored_order
from autopar.costs.terms import CostModel, TermContext
from autopar.layout.alternatives import Alternative, Alternatives, Optimum
from autopar.layout.plan import Estimate, Layout
from autopar.layout.space import Space
from autopar.search.solver import solve_space


def _scores(
    space: Space, ctx: TermContext, cm: CostModel, deadline: float, scored: Scores | None = None
) -> Scores | None:
    """Every layout of ``space`` scored, each axis value's best kept (``scored``, when the
    search already scored them so); None when the deadline ends it first."""
    if time.perf_counter() >= deadline:
        return None
    if scored is not None and scored.complete and scored.by_axis:
        return scored
    scores = score_space(space, ctx, cm, by_axis=True, deadline=deadline)
    return scores if scores.complete else None


def _axes(space: Space) -> list[str]:
    """The axes a layout is chosen by that the problem leaves more than one value."""
    return [a for a in FREE_AXES if len(space.domains[a]) > 1]


def _found(axis: str, chosen: Estimate, estimate: Estimate, proven: bool) -> Alternative:
    grows = max(estimate.time_s, key=lambda k: estimate.time_s[k] - chosen.time_s.get(k, 0.0))
    return Alternative(
        axis=axis,
        chosen=getattr(chosen.layout, AXIS[axis].layout_attr),
        outcome="found",
        estimate=estimate,
        slowdown=estimate.step_time_s / chosen.step_time_s - 1.0,
        grows=grows,
        proven=proven,
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
        out[axis] = _found(axis, chosen, estimate, proven=True)
    return [out[a] for a in _axes(space) if a in out]


def _excluding(space: Space, axis: str, value: int) -> Space:
    domains = {**space.domains, axis: tuple(v for v in space.domains[axis] if v != value)}
    return dataclasses.replace(space, domains=domains)


def _by_cpsat(space, ctx, cm, chosen: Estimate, deadline: float, workers) -> list[Alternative]:
    """One re-solve per axis with the chosen value excluded, the time left shared evenly."""
    row = chosen.layout.grid_row()
    axes = _axes(space)
    out = []
    for k, axis in enumerate(axes):
        value = getattr(chosen.layout, AXIS[axis].layout_attr)
        share = (deadline - time.perf_counter()) / (len(axes) - k)
        if share <= 0:
            out.append(Alternative(axis=axis, chosen=value, outcome="cut short"))
            continue
        result = solve_space(
            _excluding(space, axis, row[axis]), ctx, cm, time_limit_s=share, num_workers=workers
        )
        if result.layouts:
            out.append(_found(axis, chosen, result.best, proven=result.status == "optimal"))
        else:
            outcome = "none fits" if result.status == "infeasible" else "cut short"
            out.append(Alternative(axis=axis, chosen=value, outcome=outcome))
    return out


def find_alternatives(
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    chosen: Estimate,
    *,
    deadline: float,
    num_workers: int | None = None,
    scores: Scores | None = None,
) -> Alternatives:
    """For each axis of ``space`` with more than one value, the fastest fitting layout whose
    value of that axis differs from ``chosen``'s (module docstring: how, and at what cost).
    ``scores``: the search's own scoring of ``space`` by step time with ``by_axis``
    (``autopar.search.solver.solve_scored``), read instead of scoring it again."""
    start = time.perf_counter()
    scores = _scores(space, ctx, cost_model, deadline, scores)
    if scores is not None:
        items = _by_enumeration(scores, space, ctx, cost_model, chosen)
        method, count = "enumeration", scores.layouts
    else:
        items = _by_cpsat(space, ctx, cost_model, chosen, deadline, num_workers)
        method, count = "cp-sat", None
    return Alternatives(
        chosen=chosen,
        items=tuple(items),
        method=method,
        layouts=count,
        time_s=time.perf_counter() - start,
    )


def find_optimum(
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    given: Estimate,
    *,
    deadline: float,
    num_workers: int | None = None,
) -> Optimum | None:
    """The fastest fitting layout of ``space`` and ``given``'s gap to it; None when nothing fits
    or the time limit ends the search before any layout is found."""
    start = time.perf_counter()
    scores = _scores(space, ctx, cost_model, deadline)
    if scores is not None:
        if not scores.best:
            return None
        (best,) = estimate_many([Layout.from_grid_row(scores.best[0].row)], ctx, cost_model)
        proven, method, count = True, "enumeration", scores.layouts
    else:
        left = max(0.0, deadline - time.perf_counter())
        result = solve_space(space, ctx, cost_model, time_limit_s=left, num_workers=num_workers)
        if not result.layouts:
            return None
        best, proven, method, count = result.best, result.status == "optimal", "cp-sat", None
    return Optimum(
        estimate=best,
        gap=given.step_time_s / best.step_time_s - 1.0,
        proven=proven,
        method=method,
        layouts=count,
        time_s=time.perf_counter() - start,
    )
