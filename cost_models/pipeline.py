"""Pipeline schedule: critical-path slots, in-flight micro-batches and stage-to-stage traffic.

Narayanan et al. 2021 §2.2: with ``m`` micro-batches, ``p`` stages and ``v`` model chunks per
stage (interleaved 1F1B), one step takes ``(m + (p-1)/v) * (t_f + t_b)``: the bubble fraction is
``(p-1)/(v*m)`` (Llama 3 paper: "(PP-1)/(V*M)"). Korthikanti et al. 2022 §4.2.3: the first stage
holds ``p`` micro-batches of activations under 1F1B (``min(p, m)`` when there are fewer), and
``1 + (p-1)/(p*v)`` times as many with interleaving (Megatron ``theoretical_memory_usage.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.costs.schedule_slots import (
    in_flight_chunks,
    interleaved_peak_units,
    ratio_free,
    schedule_slots,
)
from autopar.costs.terms import FORWARD_SHARE, Grid, Phases, TermContext
from autopar.layout.split import stage_split
from cost_models.placement import pp_neighbour_num_nodes
from cost_models.shapes import ONE_F_ONE_B

BYTES_BF16 = 2.0
PP_OVERLAP_EXPOSED = 0.2
"""Share of the stage-to-stage transfers left exposed with P2P overlap in the interleaved
schedule (the warm-up and cool-down transfers have nothing to hide behind). Not fitted: the
same share as ``data_parallel.DP_OVERLAP_EXPOSED``."""


def first_stage_layers(num_layers: int, pp: np.ndarray) -> np.ndarray:
    """Transformer layers on the first pipeline stage, the most loaded rank for memory, in the
    split autopar plans and launches (``autopar.layout.split.stage_split``): ``L/pp`` when even;
    one fewer than the middle stages when the embedding takes a layer's slot; the ends' share
    otherwise."""
    pp = np.asarray(pp, dtype=np.int64)
    out = np.zeros(pp.shape, dtype=np.float64)
    for value in np.unique(pp):
        if 1 <= value <= num_layers:
            out[pp == value] = stage_split(num_layers, int(value))[0]
    return out


def _axes(grid: Grid, *names: str) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(grid[name], dtype=np.float64) for name in names)


def _rows(grid: Grid, *columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``(schedule, pp, vpp, grad_accum, *columns)`` and each row's index
    among them: the schedule's figures depend on these only. The integer axes are packed into
    one key (a sort of one column, not of rows)."""
    ints = [np.asarray(grid[a], dtype=np.int64) for a in ("schedule", "pp", "vpp", "grad_accum")]
    size = len(np.atleast_1d(ints[1]))
    ints = [np.broadcast_to(np.atleast_1d(x), (size,)) for x in ints]
    floats = [np.broadcast_to(np.asarray(c, dtype=np.float64), (size,)) for c in columns]
    key = ((ints[0] * (1 << 21) + ints[1]) * 128 + ints[2]) * (1 << 25) + ints[3]
    # the float columns that vary join the key by their bit patterns, in one stable sort of
    # the columns (the rows np.unique(axis=0) tells apart, without its sort of whole rows, nor
    # a sort per column: issue 23)
    varying = [f.view(np.int64) for f in floats if f.size and np.ptp(f) != 0]
    if varying:
        first, where = _distinct(key, *varying)
    else:
        _, first, where = np.unique(key, return_index=True, return_inverse=True)
    rows = np.column_stack([x[first] for x in (*ints, *floats)]).astype(np.float64)
    return rows, where


def _distinct(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique``'s ``return_index`` and ``return_inverse`` for the rows of integer
    ``columns`` in lexicographic order (each row's first occurrence: the sort is stable)."""
    order = np.lexsort(columns[::-1])
    new = np.zeros(len(order), dtype=bool)
    new[:1] = True
    for column in columns:
        ranked = column[order]
        new[1:] |= ranked[1:] != ranked[:-1]
    where = np.empty(len(order), dtype=np.int64)
    where[order] = np.cumsum(new) - 1
    return order[new], where


_REFERENCE = (FORWARD_SHARE, 1.0 - FORWARD_SHARE, 0.0, 0.0)
"""The phase shares at which ratio-free slots are taken (any would do: they do not depend on
them); those of ``PipelineSlots.evaluate``."""


def _ratio(times: Phases) -> tuple[np.ndarray, ...]:
    """Phase times as shares of the micro-batch (the schedule's slots depend on the shares)."""
    total = np.maximum(times.total(), 1e-30)
    return tuple(np.asarray(x, dtype=np.float64) / total for x in times)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSlots:
    """Micro-batch slots on the critical path of the layout's schedule, per phase
    (``autopar.costs.schedule_slots.schedule_slots``): ``grad_accum + (pp-1)/vpp`` for every
    phase of 1F1B (Narayanan 2021); the zero-bubble and DualPipe schedules fill their bubble
    with the weight gradient, so their slots differ by phase and depend on the phases' times.
    ``evaluate`` gives the slots of a term that splits by ``FORWARD_SHARE``."""

    name: str = "pipeline_slots"
    category: str = "bubble"
    depends_on: tuple[str, ...] = ("pp", "vpp", "grad_accum", "schedule")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        size = len(np.atleast_1d(grid["pp"]))
        share = np.full(size, FORWARD_SHARE)
        times = Phases(share, 1.0 - share, np.zeros(size), np.zeros(size))
        slots = self.phase_slots(grid, ctx, times)
        return slots.forward * share + slots.backward_input * (1.0 - share)

    def phase_slots(self, grid: Grid, ctx: TermContext, times: Phases) -> Phases:
        # rows whose slots are the same at every phase time (1F1B, GPipe, ...) are keyed by the
        # schedule and shape alone, at one reference ratio: the same slots, from one call per
        # shape instead of one per distinct phase ratio (a sort of every row's ratios)
        shapes, at = _rows(grid)
        free = np.array([_ratio_free(*k) for k in shapes.astype(np.int64).tolist()], dtype=bool)
        ratio = _ratio(times)
        if len(shapes) and all(np.ptp(r) == 0 for r in ratio):  # one ratio: keyed by shape
            one = tuple(float(np.ravel(r)[0]) for r in ratio)
            pairs = zip(shapes.tolist(), free.tolist(), strict=True)
            keys = [(*k, *(_REFERENCE if f else one)) for k, f in pairs]
            where = at
        else:
            ratios = [np.where(free[at], ref, r) for ref, r in zip(_REFERENCE, ratio, strict=True)]
            rows, where = _rows(grid, *ratios)
            keys = rows.tolist()
        # the distinct keys as Python numbers (a numpy row read element by element cost more
        # than the memoised simulation it keys: issue 23)
        table = np.array(
            [
                schedule_slots(
                    PIPELINE_SCHEDULES[int(k[0])], int(k[1]), int(k[2]), int(k[3]), tuple(k[4:])
                )
                for k in keys
            ]
        )
        rows = table.reshape(-1, 4)[where.ravel()]
        return Phases(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])

    def ratio_free(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        """Where the slots are the same at every phase time (``schedule_slots.ratio_free``)."""
        keys, where = _rows(grid)
        free = np.array([_ratio_free(*k) for k in keys.astype(np.int64).tolist()], dtype=bool)
        return free[where.ravel()]


@functools.lru_cache(maxsize=65536)
def _ratio_free(code: int, pp: int, vpp: int, m: int) -> bool:
    """``schedule_slots.ratio_free`` by schedule code, memoised (asked per distinct shape at
    every scoring of the slots: issue 23)."""
    return ratio_free(PIPELINE_SCHEDULES[code], pp, vpp, m)


# ONE_F_ONE_B (cost_models.shapes): the loop-style schedules whose first rank's peak has the
# closed form ``_one_f_one_b_first`` (``autopar.costs.schedule_slots.interleaved_peak_units``,
# which ``_closed_in_flight`` counts per chunk)


def _one_f_one_b_first(pp: np.ndarray, vpp: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The first rank's peak under 1F1B, in stages: ``min(pp, m)`` without interleaving, else
    its warm-up forwards plus one, ``(vpp-1)*g + 2*(pp-1) + 1`` chunks of ``g = m //
    max(1, m // pp)`` micro-batch groups (``pp`` under Megatron's ``m % pp == 0``), at most all
    ``m*vpp`` (``_closed_in_flight`` at rank 0; Korthikanti 2022 §4.2.3 ``pp + (pp-1)/vpp``)."""
    chunks = interleaved_peak_units(pp, vpp, m)
    return np.where(vpp == 1, np.minimum(pp, m), chunks / np.maximum(vpp, 1)).astype(np.float64)


def in_flight_stage_units(schedule: str, pp: int, vpp: int, m: int) -> np.ndarray:
    """Per rank: micro-batches of activations held at its peak, in stages (a chunk counts
    ``1/vpp``; ``autopar.costs.schedule_slots.in_flight_chunks``)."""
    return np.array([sum(r) for r in in_flight_chunks(schedule, pp, vpp, m)]) / vpp


@dataclass(frozen=True, slots=True, kw_only=True)
class InFlightMicrobatches:
    """Micro-batches whose activations the first rank holds at its peak, counted on the
    schedule's own order (``autopar.costs.schedule_slots.in_flight_chunks``): ``min(pp,
    grad_accum)`` for 1F1B, times ``1 + (pp-1)/(pp*vpp)`` interleaved (Korthikanti 2022 §4.2.3;
    Megatron ``theoretical_memory_usage.py``), ``pp`` on every rank for ZB-H1 and ZB-V (Qi et
    al. 2024 Table 3 "1x"), one chunk more on DualPipeV's (DeepSeek-V3 Table 2 "PP+1"), all
    ``grad_accum`` for GPipe and Looped BFS. The activation terms scale a later rank's bytes by
    its own count (``shapes.peak_in_flight_stage_bytes``)."""

    name: str = "in_flight_microbatches"
    category: str = "activations"
    depends_on: tuple[str, ...] = ("pp", "vpp", "grad_accum", "schedule")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        schedule, pp, vpp, m = (
            np.asarray(grid[a], dtype=np.int64) for a in ("schedule", "pp", "vpp", "grad_accum")
        )
        plain = np.isin(schedule, [PIPELINE_SCHEDULES.index(s) for s in ONE_F_ONE_B])
        out = np.where(plain, _one_f_one_b_first(pp, vpp, m), 0.0)
        if plain.all():
            return out
        rows = ~plain
        sub = {a: np.asarray(grid[a])[rows] for a in ("schedule", "pp", "vpp", "grad_accum")}
        out[rows] = self._ordered(sub)
        return out

    def _ordered(self, grid: Grid) -> np.ndarray:
        """The first rank's peak counted on the order (``in_flight_stage_units``)."""
        keys, where = _rows(grid)
        first = np.array([_first_rank_units(*k) for k in keys.astype(np.int64).tolist()])
        return first[where.ravel()]


@functools.lru_cache(maxsize=65536)
def _first_rank_units(code: int, pp: int, vpp: int, m: int) -> float:
    """The first rank's ``in_flight_stage_units`` by schedule code, memoised (asked per
    distinct shape at every scoring: issue 23)."""
    return float(in_flight_stage_units(PIPELINE_SCHEDULES[code], pp, vpp, m)[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class PpCommTime:
    """Stage-to-stage send/recv of one micro-batch: each of the ``vpp`` chunks of a stage receives
    its input activation forward and its gradient backward, ``mbs*s/cp*h`` BF16 elements, split
    over the TP ranks with sequence parallelism (Narayanan 2021 §4.1 "scatter/gather": ``bsh/t``).
    Adjacent stages sit ``num_gpus/pp`` ranks apart: on different nodes once that reaches a node.
    Megatron's 1F1B issues these as blocking batched isend/irecv between computations, so they
    count on the critical path; with interleaving and ``StackSpec.pp_comm_overlap`` (Megatron
    ``--overlap-p2p-communication``, ``schedules.py`` ``overlap_p2p_comm``) each transfer runs
    while the next chunk computes and ``PP_OVERLAP_EXPOSED`` of it stays exposed."""

    name: str = "pp_comm_s"
    category: str = "pp_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "vpp", "cp", "mbs", "sp")
    scatter_gather: bool = True
    """Split the boundary tensor over TP even without SP (Narayanan 2021 scatter/gather)."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        return self.phases(grid, ctx).total()

    def phases(self, grid: Grid, ctx: TermContext) -> Phases:
        """The activation's transfers with the forward, the gradient's with the backward."""
        tp, pp, vpp, cp, mbs = _axes(grid, "tp", "pp", "vpp", "cp", "mbs")
        size = mbs * ctx.training.seq_len / cp * ctx.model.hidden_size * BYTES_BF16
        split = np.where((np.asarray(grid["sp"]) == 1) | self.scatter_gather, tp, 1.0)
        nodes = pp_neighbour_num_nodes(pp, ctx.training.num_gpus, ctx.cluster.gpus_per_node)
        one = ctx.comm.time_s("send_recv", size / split, num_ranks=2.0, num_nodes=nodes)
        overlap = ctx.training.stack.pp_comm_overlap
        exposed = np.where((vpp > 1) & overlap, PP_OVERLAP_EXPOSED, 1.0)
        one_way = np.where(pp > 1, vpp * one * exposed, 0.0)
        zero = np.zeros(len(one_way))
        return Phases(one_way, one_way, zero, zero)
