"""Why this layout (issue 24): the fastest layout with each axis changed, and the optimum a given
layout is measured against (types in ``autopar.layout.alternatives``).

Exact and cheap first: the rules' space is small enough to score every layout in numpy (17,010
layouts for Llama-3 70B on 1,024 GPUs, ~0.1 s; 222,612 for Qwen3-30B-A3B on 1,024), exactly as
the brute-force oracle does (``tests/oracle.py``: ``Space.pruned_grid`` over every axis, then the
cost model's ``step_time_s`` and ``memory_bytes``), so each axis's answer is the true fastest
fitting layout with that axis changed, ties broken as the solver breaks them (whole
microseconds, then ``tie_key``). When the space is larger than ``ENUMERATION_MAX_ROWS`` or the
time limit would not allow it, each axis gets a CP-SAT re-solve with its chosen value excluded,
sharing the time left evenly; what the time did not cover is marked ``cut short``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from autopar.base.axes import AXIS, FREE_AXES, GRID_AXES, tie_key
from autopar.base.deadline import TimeLimitReached, check_deadline
from autopar.costs.estimate import estimate_many
from autopar.costs.terms import CostModel, TermContext, memory_bytes, step_time_s
from autopar.layout.alternatives import Alternative, Alternatives, Optimum
from autopar.layout.plan import Estimate, Layout
from autopar.layout.space import Space
from autopar.search.cpsat import US_PER_S
from autopar.search.solver import solve_space

ENUMERATION_MAX_ROWS = 2_000_000
"""Spaces up to this many layouts are scored whole (about 100 MB of grid and a few seconds)."""
CHUNK_ROWS = 65_536
"""Layouts scored between two looks at the deadline."""


@dataclass(frozen=True, slots=True)
class _Scores:
    grid: dict[str, np.ndarray]
    step_s: np.ndarray
    memory_bytes: np.ndarray
    fits: np.ndarray


def _scores(space: Space, ctx: TermContext, cm: CostModel, deadline: float) -> _Scores | None:
    """Every layout of ``space`` scored, or None when there are too many for the time left."""
    if time.perf_counter() >= deadline:
        return None
    grid = space.pruned_grid(GRID_AXES)  # a join filtered axis by axis: never the whole product
    rows = len(grid["tp"])
    if rows > ENUMERATION_MAX_ROWS:
        return None
    try:
        memory = _chunked(memory_bytes, cm, grid, ctx, deadline)
        fits = memory <= ctx.cluster.usable_memory_bytes
        step = np.full(rows, np.inf)  # only layouts that fit are timed: they are the answers
        step[fits] = _chunked(step_time_s, cm, {a: v[fits] for a, v in grid.items()}, ctx, deadline)
    except TimeLimitReached:
        return None
    return _Scores(grid, step, memory, fits)


def _chunked(figure, cm: CostModel, grid: dict[str, np.ndarray], ctx, deadline: float):
    """``figure(cm, grid, ctx)`` over ``CHUNK_ROWS`` rows at a time, the deadline checked
    between chunks."""
    rows = len(grid["tp"])
    out = np.empty(rows)
    for start in range(0, rows, CHUNK_ROWS):
        check_deadline(deadline)
        chunk = {a: v[start : start + CHUNK_ROWS] for a, v in grid.items()}
        out[start : start + CHUNK_ROWS] = figure(cm, chunk, ctx)
    return out


def _fastest(scores: _Scores, where: np.ndarray) -> dict[str, int] | None:
    """The fastest row of ``where``: least whole microseconds, then ``tie_key``."""
    if not where.any():
        return None
    us = np.where(where, np.round(scores.step_s * US_PER_S), np.inf)  # inf: does not fit
    ties = np.flatnonzero(us == us.min())
    rows = [{a: int(scores.grid[a][i]) for a in GRID_AXES} for i in ties]
    return min(rows, key=tie_key)


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


def _by_enumeration(scores, space, ctx, cm, chosen: Estimate) -> list[Alternative]:
    row = chosen.layout.grid_row()
    rows: dict[str, dict[str, int]] = {}
    out: dict[str, Alternative] = {}
    for axis in _axes(space):
        other = scores.grid[axis] != row[axis]
        best = _fastest(scores, other & scores.fits)
        if best is not None:
            rows[axis] = best
            continue
        value = getattr(chosen.layout, AXIS[axis].layout_attr)
        if not other.any():  # the rules leave this problem's layouts this one value
            out[axis] = Alternative(axis=axis, chosen=value, outcome="none allowed")
            continue
        least = float(scores.memory_bytes[other].min())
        out[axis] = Alternative(
            axis=axis, chosen=value, outcome="none fits", min_memory_bytes=least
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
) -> Alternatives:
    """For each axis of ``space`` with more than one value, the fastest fitting layout whose
    value of that axis differs from ``chosen``'s (module docstring: how, and at what cost)."""
    start = time.perf_counter()
    scores = _scores(space, ctx, cost_model, deadline)
    if scores is not None:
        items = _by_enumeration(scores, space, ctx, cost_model, chosen)
        method, count = "enumeration", len(scores.step_s)
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
        row = _fastest(scores, scores.fits)
        if row is None:
            return None
        (best,) = estimate_many([Layout.from_grid_row(row)], ctx, cost_model)
        proven, method, count = True, "enumeration", len(scores.step_s)
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
