"""The figures that price a per-stage pipeline plan (``autopar.layout.stages``): per-stage
micro-batch times and memory over the rows of a ``StageCosts``, under a pipeline schedule
(``autopar.costs.schedule.PipelineSchedule``: the micro-batches in flight per chunk weigh each
chunk's activations, and its closed form turns the stage times into the step the search ranks
by; ``MEGATRON`` by default).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autopar.costs.schedule import MEGATRON, PipelineSchedule
from autopar.costs.stage_costs import StageCosts
from autopar.layout.stages import RECOMPUTE_CODES, StageEstimate, StagePlan, placement_of

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
    chunk_weight_s: np.ndarray
    """``(rows, pp, vpp)``: of that backward, the weight gradient (``StageCosts.weight_s``;
    zero where the costs carry none)."""


@dataclass(frozen=True, slots=True)
class _PlanTables:
    """What ``stage_figures`` needs of a plan apart from the rows, chunks in stage-major order
    (stage ``i``'s chunks ``i, pp + i, ...`` together): per chunk its layer kinds in the order
    they first occur in it (slot ``s`` of a chunk is its ``s``-th kind, so the sums run in the
    order of the plain per-chunk loop and give the same floats) with their layer counts, and
    per stage its workspaces."""

    kind: np.ndarray
    """``(slots, chunks)``: index into the distinct kinds (0 where the chunk has fewer)."""
    present: np.ndarray | None
    """``(slots, chunks)``: the slot holds a kind (``None``: every slot does)."""
    layers: np.ndarray
    """``(slots, chunks)``: layers of the slot's kind."""
    kept: np.ndarray
    """``(slots, chunks)``: of those, the ones not fully recomputed."""
    full: np.ndarray
    """``(slots, chunks)``: the fully recomputed ones."""
    base: np.ndarray
    """``(chunks,)``: recompute code of the kept layers (``selective`` or none)."""
    full_workspace: np.ndarray
    """``(pp,)``: the stage fully recomputes some layer."""
    selective_workspace: np.ndarray


@functools.lru_cache(maxsize=4096)
def _plan_tables(plan: StagePlan, kinds: tuple[str, ...]) -> _PlanTables:
    distinct = {k: j for j, k in enumerate(dict.fromkeys(kinds))}
    bounds = plan.bounds()
    order = [c for i in range(plan.pp) for c in plan.chunks_of(i)]
    slots: list[list[tuple[int, int, int]]] = []  # per chunk: (kind, layers, fully recomputed)
    for c in order:
        start, end = bounds[c]
        full = plan.recomputed_layers(c)
        here = kinds[start:end]
        if here and here.count(here[0]) == len(here):  # one kind: the loop's single entry
            slots.append([(distinct[here[0]], end - start, min(full, end - start))])
            continue
        counts: dict[int, list[int]] = {}
        for index in range(start, end):
            entry = counts.setdefault(distinct[kinds[index]], [0, 0])
            entry[0] += 1
            entry[1] += index < start + full
        slots.append([(k, n, f) for k, (n, f) in counts.items()])
    chunks, width = len(slots), max((len(s) for s in slots), default=0)
    table = np.zeros((3, width, chunks), dtype=np.int64)
    present = np.zeros((width, chunks), dtype=bool)
    for c, entries in enumerate(slots):
        for s, entry in enumerate(entries):
            table[:, s, c] = entry
            present[s, c] = True
    full_ws = [
        plan.recompute[i].mode == "full"
        and any(plan.recomputed_layers(c) for c in plan.chunks_of(i))
        for i in range(plan.pp)
    ]
    selective = np.array([r.mode == "selective" for r in plan.recompute], dtype=bool)
    return _PlanTables(
        kind=table[0],
        present=None if present.all() else present,
        layers=table[1].astype(np.float64),
        kept=(table[1] - table[2]).astype(np.float64),
        full=table[2].astype(np.float64),
        base=np.where(np.repeat(selective, plan.vpp), RECOMPUTE_CODES["selective"], 0),
        full_workspace=np.array(full_ws, dtype=bool),
        selective_workspace=selective,
    )


@functools.lru_cache(maxsize=1024)
def _in_flight_table(schedule: PipelineSchedule, pp: int, vpp: int, m: int) -> np.ndarray:
    """``(pp, vpp)``: micro-batches in flight per stage and chunk (``schedule.in_flight``)."""
    table = np.array([schedule.in_flight(pp, vpp, m, i) for i in range(pp)], dtype=np.float64)
    table.flags.writeable = False
    return table


def _chunk_sums(t: _PlanTables, costs: StageCosts, *, forward: bool) -> tuple:
    """``(rows, chunks)`` (stage-major) time, activations, static bytes, and forward and
    weight gradient (both ``None`` unless ``forward``) of every chunk's layers, summed slot by
    slot (``_PlanTables``)."""
    names = costs.kinds
    time = _by_kind(costs.time_s, names)  # (rows, kinds, 3)
    act = _by_kind(costs.activation_bytes, names)
    static = _by_kind(costs.static_bytes, names)
    weight = _by_kind(costs.weight_s, names) if forward else None
    sums = [np.zeros((time.shape[0], t.kind.shape[1])) for _ in range(5 if forward else 3)]
    for s in range(t.kind.shape[0]):
        k, n, kept, full = t.kind[s], t.layers[s], t.kept[s], t.full[s]
        terms = [
            kept * time[:, k, t.base] + full * time[:, k, 2],
            kept * act[:, k, t.base] + full * act[:, k, 2],
            n * static[:, k],
        ]
        if forward:
            terms.append(n * FORWARD_SHARE * time[:, k, 0])
            terms.append(kept * weight[:, k, t.base] + full * weight[:, k, 2])
        for total, term in zip(sums, terms, strict=True):
            total += term if t.present is None else np.where(t.present[s], term, 0.0)
    return tuple(sums) if forward else (*sums, None, None)


def _by_kind(arrays, names: tuple[str, ...]) -> np.ndarray:
    """``arrays`` stacked on a kind axis after the rows (one kind: a view, no copy; the same
    values either way)."""
    if len(names) == 1:
        return np.asarray(arrays[names[0]])[:, None]
    return np.stack([np.asarray(arrays[k]) for k in names], axis=1)


def _chunk_sums_of_stages(by_stage: np.ndarray) -> np.ndarray:
    """``(rows, pp)`` sums over the chunks of ``(rows, pp, vpp)``, in numpy's order for
    ``chunk[:, mine].sum(axis=1)``: that gather is column-major, so over several rows numpy adds
    the chunks one after another, and over one row (contiguous) pairwise (``_methods._sum``)."""
    if by_stage.shape[0] == 1:
        return np.ascontiguousarray(by_stage).sum(axis=2)
    total = by_stage[:, :, 0].copy()
    for j in range(1, by_stage.shape[2]):
        total += by_stage[:, :, j]
    return total


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTotals:
    """What the searches rank and fit plans by, over the rows of a ``StageCosts``: the
    ``StageFigures`` fields of the same names, the same floats, without the per-chunk split."""

    time_s: np.ndarray
    memory_bytes: np.ndarray
    step_time_s: np.ndarray


def stage_totals(
    plan: StagePlan,
    costs: StageCosts,
    num_microbatches: np.ndarray,
    *,
    schedule: PipelineSchedule = MEGATRON,
) -> StageTotals:
    """``stage_figures``' stage times, peak bytes and step, for the searches (cheaper)."""
    parts = _stage_parts(plan, costs, num_microbatches, schedule, forward=False)
    return StageTotals(
        time_s=parts["times"], memory_bytes=parts["memory"], step_time_s=parts["step"]
    )


def stage_figures(
    plan: StagePlan,
    costs: StageCosts,
    num_microbatches: np.ndarray,
    *,
    schedule: PipelineSchedule = MEGATRON,
) -> StageFigures:
    """Time and memory of every stage of ``plan`` on each row of ``costs`` under ``schedule``.

    Every sum runs in the order of the plain loops over chunks and stages it replaces
    (``_chunk_sums_of_stages``), so the figures are the same floats."""
    parts = _stage_parts(plan, costs, num_microbatches, schedule, forward=True)
    vpp, chunk_time = plan.vpp, parts["chunk_time"]
    # Per chunk: the stage's own terms spread over its chunks, the embedding on its first
    # chunk, the output layer and loss on the last.
    last = plan.last_stage  # its last local chunk is the pipeline's last in either placement
    total = chunk_time + (costs.every_time_s / vpp)[:, None, None]
    total[:, 0, 0] += costs.first_time_s
    total[:, last, vpp - 1] += costs.last_time_s
    forward = parts["chunk_forward"] + FORWARD_SHARE * (total - chunk_time)
    weight = parts["chunk_weight"] + (costs.every_weight_s / vpp)[:, None, None]
    weight[:, 0, 0] += costs.first_weight_s
    weight[:, last, vpp - 1] += costs.last_weight_s
    return StageFigures(
        time_s=parts["times"],
        memory_bytes=parts["memory"],
        static_bytes=parts["static"],
        activation_bytes=parts["acts"],
        num_microbatches=parts["m"],
        step_time_s=parts["step"],
        chunk_forward_s=forward,
        chunk_backward_s=total - forward,
        chunk_weight_s=weight,
    )


def _stage_parts(plan, costs: StageCosts, num_microbatches, schedule, *, forward: bool) -> dict:
    """The shared part of ``stage_figures`` and ``stage_totals`` (chunks ``(rows, pp, vpp)``)."""
    m_rows = np.asarray(num_microbatches, dtype=np.int64)
    rows = len(m_rows)
    pp, vpp, last = plan.pp, plan.vpp, plan.last_stage
    if plan.placement != placement_of(schedule.name):
        raise ValueError(f"a {plan.placement}-placed plan under the {schedule.name} schedule")
    t = _plan_tables(plan, tuple(costs.layer_kinds))
    # stage-major (rows, pp, vpp): chunk j of stage i is the plan's chunks_of(i)[j]
    chunk_time, chunk_act, chunk_static, chunk_fwd, chunk_weight = (
        None if x is None else x.reshape(rows, pp, vpp)
        for x in _chunk_sums(t, costs, forward=forward)
    )
    chunk_act[:, 0, 0] += costs.first_activation_bytes
    chunk_act[:, last, vpp - 1] += costs.last_activation_bytes
    times = _chunk_sums_of_stages(chunk_time) + costs.every_time_s[:, None]
    static = _chunk_sums_of_stages(chunk_static) + costs.every_static_bytes[:, None]
    times[:, 0] += costs.first_time_s
    static[:, 0] += costs.first_static_bytes
    times[:, last] += costs.last_time_s
    static[:, last] += costs.last_static_bytes
    static[:, t.full_workspace] += costs.full_workspace_bytes[:, None]
    static[:, t.selective_workspace] += costs.selective_workspace_bytes[:, None]
    chunk_act[:, :, 0] += costs.every_activation_bytes[:, None]
    # in-flight counts per row, stage and chunk: one table per distinct micro-batch count; the
    # plain loop summed a C-ordered product (numpy: pairwise over the chunks)
    if rows and (m_rows == m_rows[0]).all():  # one count: its table broadcast, same products
        flights = _in_flight_table(schedule, pp, vpp, int(m_rows[0]))
    else:
        distinct_m = np.unique(m_rows)
        tables = np.stack([_in_flight_table(schedule, pp, vpp, int(m)) for m in distinct_m])
        flights = tables[np.searchsorted(distinct_m, m_rows)]
    acts = np.ascontiguousarray(flights * chunk_act).sum(axis=2)
    step = costs.step_time_s + pipeline_time_s(times, m_rows, vpp, schedule=schedule)
    return {
        "m": m_rows,
        "times": times,
        "static": static,
        "acts": acts,
        "memory": static + acts,
        "step": step,
        "chunk_time": chunk_time,
        "chunk_forward": chunk_fwd,
        "chunk_weight": chunk_weight,
    }


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
        weight_s=figures.chunk_weight_s[row],
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
                    for part, here in (("embedding", i == 0), ("loss", i == plan.last_stage))
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
