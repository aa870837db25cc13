"""Brute force over the same rules and terms: the test oracle for the CP-SAT solver (DESIGN §3)."""

from __future__ import annotations

import numpy as np

from autopar.axes import GRID_AXES
from autopar.space import build_space
from autopar.specs import Problem
from autopar.terms import CostModel, TermContext, memory_bytes, step_time_s


def enumerate_layouts(problem: Problem, ctx: TermContext, cost_model: CostModel):
    """Every layout the rules allow, with its float step time and memory (numpy arrays)."""
    grid = build_space(problem).pruned_grid(GRID_AXES)
    if not len(grid["tp"]):
        return grid, np.array([]), np.array([])
    return grid, step_time_s(cost_model, grid, ctx), memory_bytes(cost_model, grid, ctx)


def oracle_min_s(
    problem: Problem, ctx: TermContext, cost_model: CostModel, *, margin_bytes: float = 0.0
) -> float:
    """Smallest step time over the layouts within capacity - margin (inf when none)."""
    _, times, memory = enumerate_layouts(problem, ctx, cost_model)
    fits = memory <= ctx.cluster.usable_memory_bytes - margin_bytes
    return float(times[fits].min()) if fits.any() else float("inf")
