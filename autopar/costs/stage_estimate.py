"""Score a layout with a per-stage pipeline plan, in float (the report side of issue 13).

The headline figures come from ``autopar.costs.stage_figures`` (per-stage times and memories
over the ``autopar.costs.stage_costs`` of the layout); the step time is the schedule simulated over
the chunk times (``autopar.costs.schedule``), the schedule formula's value kept as
``PerStage.formula_step_time_s``. The breakdowns keep the categories of ``Estimate``: the
peak stage's static bytes are split in the proportions the uniform cost model gives them
(weights, gradients, optimizer states, other), its activations are its own; the step time is
split into the step terms' categories (as the uniform model has them), ``bubble`` (the
pipeline's idle time: step less the step terms less ``m`` times the slowest stage), and the
per-micro-batch categories in the uniform model's proportions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autopar.costs.estimate import estimate
from autopar.costs.goodput import run_figures
from autopar.costs.schedule import PipelineSchedule
from autopar.costs.stage_costs import probe_stage_costs
from autopar.costs.stage_figures import (
    StageFigures,
    simulated_pipeline_s,
    stage_figures,
    stage_rows,
)
from autopar.costs.stage_schedules import stage_schedule
from autopar.costs.terms import CostModel, TermContext, grid_of
from autopar.layout.plan import Estimate, Layout
from autopar.layout.stages import (
    RECOMPUTE_CODES,
    PerStage,
    StagePlan,
    placement_of,
    plan_recompute_mode,
)

STATIC_CATEGORIES = ("weights", "gradients", "optimizer", "other", "reserve")


def estimate_plan(
    layout: Layout,
    plan: StagePlan,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    plan_from: str = "given",
    schedule: PipelineSchedule | None = None,
    memo: dict | None = None,
) -> Estimate:
    """The estimate of ``layout`` run with ``plan``: the uniform estimate of the layout with
    the per-stage figures in place of its own (``dataclasses.replace``, so everything else it
    carries, ``inputs`` and ``choices`` among it, is the uniform estimate's) and
    ``per_stage`` set (``plan_from``: ``PerStage``); ``schedule`` is the layout's own
    (``autopar.costs.stage_schedules.stage_schedule``) unless given; ``memo`` (a dict the
    caller keeps for one ``ctx`` and ``cost_model``) shares the layout's probed costs and
    uniform estimate between the plans estimated on it (``_layout_parts``)."""
    if schedule is None:
        schedule = stage_schedule(layout.pipeline_schedule)
    # the chunks are listed in model order whatever the placement: the schedule places them
    plan = dataclasses.replace(plan, placement=placement_of(layout.pipeline_schedule))
    grid, costs, base = _layout_parts(layout, ctx, cost_model, memo)
    figures = stage_figures(plan, costs, grid["grad_accum"], schedule=schedule)
    # The step of the schedule simulated over the chunk times (autopar.costs.schedule); the
    # formula the search ranks by is kept alongside.
    step = float(costs.step_time_s[0]) + simulated_pipeline_s(figures, 0, schedule=schedule)
    peak_flop_per_s = ctx.cluster.gpu.peak_flop_per_s(ctx.training.precision)
    gpu_flop_per_s = peak_flop_per_s * layout.num_gpus * step
    model_flop = float(np.asarray(cost_model.flops.model_flop(grid, ctx)).reshape(-1)[0])
    hardware_flop = model_flop + _recompute_flop(plan, grid, ctx, cost_model, model_flop)
    per_stage = PerStage(
        plan=plan,
        stages=tuple(stage_rows(plan, figures, 0, costs.layer_kinds, schedule=schedule)),
        formula_step_time_s=float(figures.step_time_s[0]),
        plan_from=plan_from,
    )
    tokens_per_s = float(ctx.training.global_batch_tokens / step)
    return dataclasses.replace(
        base,
        fits=bool(figures.memory_bytes[0].max() <= base.capacity_bytes),
        step_time_s=step,
        tokens_per_s=tokens_per_s,
        mfu=model_flop / gpu_flop_per_s,
        hfu=hardware_flop / gpu_flop_per_s,
        memory_bytes=_memory_bytes(figures, base),
        time_s=_time_s(figures, base, cost_model, step=step, num_microbatches=layout.grad_accum),
        per_stage=per_stage,
        # no goodput for per-stage plans (the checkpoint term prices a uniform split): the
        # days are the failure-free ones only
        goodput=None,
        **run_figures(tokens_per_s, None, ctx),
    )


def _layout_parts(layout: Layout, ctx: TermContext, cost_model: CostModel, memo: dict | None):
    """The grid of ``layout``, its ``StageCosts`` and its uniform estimate: pure functions of
    ``(layout, ctx, cost_model)``, so a ``memo`` kept for one ``ctx`` and ``cost_model`` (keyed
    by the layout, a frozen dataclass) returns the same objects for the same layout."""
    if memo is not None and layout in memo:
        return memo[layout]
    grid = grid_of([layout])
    parts = (grid, probe_stage_costs(cost_model, ctx, grid), estimate(layout, ctx, cost_model))
    if memo is not None:
        memo[layout] = parts
    return parts


def _memory_bytes(figures: StageFigures, base: Estimate) -> dict[str, float]:
    """The peak stage's memory: its static bytes in the uniform estimate's proportions, its
    own activations (module docstring)."""
    peak = int(np.argmax(figures.memory_bytes[0]))
    static = float(figures.static_bytes[0, peak])
    shares = {c: base.memory_bytes.get(c, 0.0) for c in STATIC_CATEGORIES}
    total_share = sum(shares.values()) or 1.0
    memory = {c: static * shares[c] / total_share for c in STATIC_CATEGORIES}
    memory["activations"] = float(figures.activation_bytes[0, peak])
    memory["total"] = float(figures.memory_bytes[0, peak])
    return memory


def _time_s(
    figures: StageFigures,
    base: Estimate,
    cost_model: CostModel,
    *,
    step: float,
    num_microbatches: int,
) -> dict[str, float]:
    """The step split into the uniform estimate's categories (module docstring)."""
    busy = num_microbatches * float(figures.time_s[0].max())
    step_categories = {t.category for t in cost_model.step_terms}
    fixed = {c: v for c, v in base.time_s.items() if c in step_categories}
    per_mb = {c: v for c, v in base.time_s.items() if c not in step_categories and c != "bubble"}
    per_mb_total = sum(per_mb.values()) or 1.0
    time_s = {c: busy * v / per_mb_total for c, v in per_mb.items()}
    time_s.update(fixed)
    time_s["bubble"] = max(0.0, step - sum(fixed.values()) - busy)
    return {c: time_s.get(c, 0.0) for c in base.time_s}


def _recompute_flop(plan: StagePlan, grid, ctx, cost_model: CostModel, model_flop: float) -> float:
    """Re-executed FLOPs: each recomputed layer's share of what recomputing every layer adds."""
    layers = sum(plan.chunk_layers)
    extra = {}
    for mode in ("selective", "full"):
        row = dict(grid)
        row["recompute"] = np.array([RECOMPUTE_CODES[mode]])
        hardware = float(np.asarray(cost_model.flops.hardware_flop(row, ctx)).reshape(-1)[0])
        extra[mode] = (hardware - model_flop) / layers
    total = 0.0
    for c, n in enumerate(plan.chunk_layers):
        rec = plan.recompute[plan.rank_of(c)]
        if rec.mode == "selective":
            total += n * extra["selective"]
        elif rec.mode == "full":
            total += plan.recomputed_layers(c) * extra["full"]
    return total


def with_plan_recompute(layout: Layout, plan: StagePlan) -> Layout:
    """``layout`` with ``recompute`` summarising the plan (full if any stage recomputes layers
    fully, else selective if any stage does, else none)."""
    return dataclasses.replace(layout, recompute=plan_recompute_mode(plan))
