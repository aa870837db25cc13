"""The figures that price a per-stage pipeline plan (``autopar.layout.stages``): per-stage
micro-batch times and memory over the rows of a ``StageCosts``, under a pipeline schedule
(``autopar.costs.schedule.PipelineSchedule``: the micro-batches in flight per chunk weigh each
chunk's activations, and its closed form turns the stage times into the step the search ranks
by; ``MEGATRON`` by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autopar.costs.schedule import MEGATRON, PipelineSchedule
from autopar.costs.stage_costs import StageCosts
from autopar.layout.stages import RECOMPUTE_CODES, StageEstimate, StagePlan

FORWARD_SHARE = 1.0 / 3.0
"""Forward's share of a micro-batch's forward + backward without recompute: the backward
computes gradients of inputs and of weights, twice the forward's FLOPs (Narayanan et al. 2021
§3.5, ``96 B s l h^2`` of which the forward is a third); recompute adds to the backward."""


def pipeline_time_s(
    stage_times_s: np.ndarray,
    num_microbatches,
    vpp: int,
    *,
    schedule: PipelineSchedule = MEGATRON,
) -> np.ndarray:
    """The pipeline part of the step by the schedule's closed form, from per-stage micro-batch
    times ``(rows, pp)``."""
    return schedule.pipeline_s(
        stage_times_s.max(axis=1),
        stage_times_s.sum(axis=1),
        num_microbatches,
        pp=stage_times_s.shape[1],
        vpp=vpp,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StageFigures:
    """Per-stage figures of a plan over the rows of a ``StageCosts``."""

    time_s: np.ndarray
    """``(rows, pp)``: one micro-batch, forward + backward (+ recompute)."""
    memory_bytes: np.ndarray
    """``(rows, pp)``: peak bytes of each stage."""
    static_bytes: np.ndarray
    activation_bytes: np.ndarray
    """``(rows, pp)``: activations in flight at the peak."""
    num_microbatches: np.ndarray
    step_time_s: np.ndarray
    """Step terms plus the schedule formula (``pipeline_time_s``), what the search ranks by."""
    chunk_forward_s: np.ndarray
    """``(rows, pp, vpp)``: one micro-batch's forward on chunk ``j`` of stage ``i``."""
    chunk_backward_s: np.ndarray
    """``(rows, pp, vpp)``: its backward, with the recompute."""


def _chunk_kinds(plan: StagePlan, kinds: Sequence[str]) -> list[tuple[dict, dict]]:
    """Per chunk: (kind counts of all its layers, kind counts of its fully recomputed ones)."""
    out = []
    for c, (start, end) in enumerate(plan.bounds()):
        full = plan.recomputed_layers(c)
        counts: dict[str, int] = {}
        recomputed: dict[str, int] = {}
        for index in range(start, end):
            counts[kinds[index]] = counts.get(kinds[index], 0) + 1
            if index < start + full:
                recomputed[kinds[index]] = recomputed.get(kinds[index], 0) + 1
        out.append((counts, recomputed))
    return out


def stage_figures(
    plan: StagePlan,
    costs: StageCosts,
    num_microbatches: np.ndarray,
    *,
    schedule: PipelineSchedule = MEGATRON,
) -> StageFigures:
    """Time and memory of every stage of ``plan`` on each row of ``costs`` under ``schedule``."""
    m_rows = np.asarray(num_microbatches, dtype=np.int64)
    rows = len(m_rows)
    pp, chunks = plan.pp, plan.pp * plan.vpp
    chunk_time = np.zeros((rows, chunks))
    chunk_fwd = np.zeros((rows, chunks))
    chunk_act = np.zeros((rows, chunks))
    chunk_static = np.zeros((rows, chunks))
    for c, (counts, recomputed) in enumerate(_chunk_kinds(plan, costs.layer_kinds)):
        mode = plan.recompute[c % pp].mode
        base = RECOMPUTE_CODES["selective"] if mode == "selective" else 0
        for kind, n in counts.items():
            full = recomputed.get(kind, 0)
            time, act = costs.time_s[kind], costs.activation_bytes[kind]
            chunk_time[:, c] += (n - full) * time[:, base] + full * time[:, 2]
            chunk_fwd[:, c] += n * FORWARD_SHARE * time[:, 0]
            chunk_act[:, c] += (n - full) * act[:, base] + full * act[:, 2]
            chunk_static[:, c] += n * costs.static_bytes[kind]
    chunk_act[:, 0] += costs.first_activation_bytes
    chunk_act[:, chunks - 1] += costs.last_activation_bytes
    times = np.zeros((rows, pp))
    static = np.zeros((rows, pp))
    acts = np.zeros((rows, pp))
    distinct_m = np.unique(m_rows)
    for i in range(pp):
        mine = list(plan.chunks_of(i))
        times[:, i] = chunk_time[:, mine].sum(axis=1) + costs.every_time_s
        static[:, i] = chunk_static[:, mine].sum(axis=1) + costs.every_static_bytes
        if i == 0:
            times[:, i] += costs.first_time_s
            static[:, i] += costs.first_static_bytes
        if i == pp - 1:
            times[:, i] += costs.last_time_s
            static[:, i] += costs.last_static_bytes
        rec = plan.recompute[i]
        if rec.mode == "full" and any(plan.recomputed_layers(c) for c in mine):
            static[:, i] += costs.full_workspace_bytes
        if rec.mode == "selective":
            static[:, i] += costs.selective_workspace_bytes
        held = chunk_act[:, mine]
        held[:, 0] += costs.every_activation_bytes
        # in-flight counts per row and chunk: one lookup per distinct micro-batch count
        table = np.array(
            [schedule.in_flight(pp, plan.vpp, int(m), i) for m in distinct_m], dtype=np.float64
        )
        weights = table[np.searchsorted(distinct_m, m_rows)]
        acts[:, i] = (weights * held).sum(axis=1)
    step = costs.step_time_s + pipeline_time_s(times, m_rows, plan.vpp, schedule=schedule)
    # Per chunk (stage-major): the stage's own terms spread over its chunks, the embedding on
    # its first chunk, the output layer and loss on the last.
    order = [c for i in range(pp) for c in plan.chunks_of(i)]
    total = (
        chunk_time[:, order].reshape(rows, pp, plan.vpp)
        + (costs.every_time_s / plan.vpp)[:, None, None]
    )
    total[:, 0, 0] += costs.first_time_s
    total[:, pp - 1, plan.vpp - 1] += costs.last_time_s
    forward = chunk_fwd[:, order].reshape(rows, pp, plan.vpp) + FORWARD_SHARE * (
        total - chunk_time[:, order].reshape(rows, pp, plan.vpp)
    )
    return StageFigures(
        time_s=times,
        memory_bytes=static + acts,
        static_bytes=static,
        activation_bytes=acts,
        num_microbatches=m_rows,
        step_time_s=step,
        chunk_forward_s=forward,
        chunk_backward_s=total - forward,
    )


def simulated_pipeline_s(
    figures: StageFigures, row: int, *, schedule: PipelineSchedule = MEGATRON
) -> float:
    """The pipeline part of the step (step terms excluded) for one row, by simulating the
    schedule over the chunk times (``autopar.costs.schedule``). Megatron's closed form is exact
    for equal stages only: for unequal ones 1F1B's is an upper bound and the interleaved one is
    off either way (``tests/test_stages.py``)."""
    return schedule.simulate_s(
        figures.chunk_forward_s[row],
        figures.chunk_backward_s[row],
        int(figures.num_microbatches[row]),
    )


def stage_rows(
    plan: StagePlan,
    figures: StageFigures,
    row: int,
    kinds: Sequence[str],
    *,
    schedule: PipelineSchedule = MEGATRON,
) -> list[StageEstimate]:
    """The per-stage table of one row: layers and their kinds, recompute, time, memory, in-flight
    micro-batches (``StageEstimate`` records)."""
    out = []
    bounds = plan.bounds()
    for i in range(plan.pp):
        mine = plan.chunks_of(i)
        kinds_here: dict[str, int] = {}
        for c in mine:
            for index in range(*bounds[c]):
                kinds_here[kinds[index]] = kinds_here.get(kinds[index], 0) + 1
        out.append(
            StageEstimate(
                stage=i,
                chunk_layers=tuple(plan.chunk_layers[c] for c in mine),
                first_layer=bounds[mine[0]][0],
                layer_kinds=kinds_here,
                holds=tuple(
                    part
                    for part, here in (("embedding", i == 0), ("loss", i == plan.pp - 1))
                    if here
                ),
                recompute=plan.recompute[i].text(),
                time_s=float(figures.time_s[row, i]),
                memory_bytes=float(figures.memory_bytes[row, i]),
                activation_bytes=float(figures.activation_bytes[row, i]),
                in_flight=schedule.in_flight(
                    plan.pp, plan.vpp, int(figures.num_microbatches[row]), i
                ),
            )
        )
    return out
