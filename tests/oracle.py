"""Brute force over the same rules and terms: the test oracle for the CP-SAT solver (DESIGN §3)."""

from __future__ import annotations

import numpy as np

from autopar.base.axes import GRID_AXES
from autopar.costs.terms import CostModel, TermContext, memory_bytes, step_time_s
from autopar.layout.space import Space


def enumerate_layouts(space: Space, ctx: TermContext, cost_model: CostModel):
    """Every layout the rules allow, with its float step time and memory (numpy arrays)."""
    grid = space.pruned_grid(GRID_AXES)
    if not len(grid["tp"]):
        return grid, np.array([]), np.array([])
    return grid, step_time_s(cost_model, grid, ctx), memory_bytes(cost_model, grid, ctx)


def oracle_min_s(
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    margins_bytes: tuple[float, ...] = (0.0,),
) -> tuple[float, ...]:
    """Smallest step time over the layouts within capacity - margin (inf when none), for each
    margin, from one enumeration."""
    _, times, memory = enumerate_layouts(space, ctx, cost_model)
    out = []
    for margin in margins_bytes:
        fits = memory <= ctx.cluster.usable_memory_bytes - margin
        out.append(float(times[fits].min()) if fits.any() else float("inf"))
    return tuple(out)
