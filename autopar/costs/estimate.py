"""Score one layout with a cost model, in float (the report side of DESIGN §3)."""

from __future__ import annotations

import numpy as np

from autopar.costs.comm import collective_sources
from autopar.costs.error_bands import BANDED_COST_MODELS, band_of
from autopar.costs.goodput import goodput_figures, run_figures
from autopar.costs.terms import (
    CostModel,
    TermContext,
    grid_of,
    memory_breakdown_bytes,
    time_figures,
)
from autopar.inputs.echo import inputs_dict
from autopar.layout.plan import Estimate, Layout


def estimate_many(layouts: list[Layout], ctx: TermContext, cost_model: CostModel) -> list[Estimate]:
    """Estimates of several layouts, evaluated together (vectorised over the layouts)."""
    if not layouts:
        return []
    grid = grid_of(layouts)
    step_s, pipeline, times = time_figures(cost_model, grid, ctx)
    bubble = np.divide(times["bubble"], pipeline, out=np.zeros(len(pipeline)), where=pipeline > 0)
    memory = memory_breakdown_bytes(cost_model, grid, ctx)
    model_flop = cost_model.flops.model_flop(grid, ctx)
    hardware_flop = cost_model.flops.hardware_flop(grid, ctx)
    peak_flop_per_s = ctx.cluster.gpu.peak_flop_per_s(ctx.training.precision)
    capacity = float(ctx.cluster.usable_memory_bytes)
    decided = cost_model.decisions.decide(grid, ctx) if cost_model.decisions else {}
    tokens = ctx.training.global_batch_tokens
    inputs = inputs_dict(ctx.model, ctx.cluster, ctx.training, sources=collective_sources(ctx.comm))
    band = band_of(ctx).to_dict() if cost_model.name in BANDED_COST_MODELS else None
    goodputs = goodput_figures(step_s, grid, ctx, cost_model)
    out = []
    for i, layout in enumerate(layouts):
        gpu_flop_per_s = peak_flop_per_s * layout.num_gpus * step_s[i]
        goodput = goodputs[i] if goodputs else None
        tokens_per_s = float(tokens / step_s[i])
        out.append(
            Estimate(
                layout=layout,
                fits=bool(memory["total"][i] <= capacity),
                step_time_s=float(step_s[i]),
                tokens_per_s=tokens_per_s,
                mfu=float(np.broadcast_to(model_flop, step_s.shape)[i] / gpu_flop_per_s),
                hfu=float(np.broadcast_to(hardware_flop, step_s.shape)[i] / gpu_flop_per_s),
                memory_bytes={k: float(v[i]) for k, v in memory.items()},
                capacity_bytes=capacity,
                time_s={k: float(v[i]) for k, v in times.items()},
                bubble_fraction=float(bubble[i]),
                inputs=inputs,
                choices={name: str(values[i]) for name, values in decided.items()},
                error_band=band,
                goodput=goodput,
                **run_figures(tokens_per_s, goodput.goodput if goodput else None, ctx),
            )
        )
    return out


def estimate(layout: Layout, ctx: TermContext, cost_model: CostModel) -> Estimate:
    return estimate_many([layout], ctx, cost_model)[0]
