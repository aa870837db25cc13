"""Pipeline schedule: critical-path slots, in-flight micro-batches and stage-to-stage traffic.

Narayanan et al. 2021 §2.2: with ``m`` micro-batches, ``p`` stages and ``v`` model chunks per
stage (interleaved 1F1B), one step takes ``(m + (p-1)/v) * (t_f + t_b)``: the bubble fraction is
``(p-1)/(v*m)`` (Llama 3 paper: "(PP-1)/(V*M)"). Korthikanti et al. 2022 §4.2.3: the first stage
holds ``p`` micro-batches of activations under 1F1B (``min(p, m)`` when there are fewer), and
``1 + (p-1)/(p*v)`` times as many with interleaving (Megatron ``theoretical_memory_usage.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.costs.terms import Grid, TermContext
from autopar.layout.split import stage_split
from cost_models.placement import pp_neighbour_num_nodes

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


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSlots:
    """Micro-batch slots on the critical path: ``grad_accum + (pp-1)/vpp`` (Narayanan 2021)."""

    name: str = "pipeline_slots"
    category: str = "bubble"
    depends_on: tuple[str, ...] = ("pp", "vpp", "grad_accum")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        pp, vpp, grad_accum = _axes(grid, "pp", "vpp", "grad_accum")
        return grad_accum + (pp - 1.0) / vpp


@dataclass(frozen=True, slots=True, kw_only=True)
class InFlightMicrobatches:
    """Micro-batches whose activations the first stage holds at its peak:
    ``min(pp, grad_accum)``, times ``1 + (pp-1)/(pp*vpp)`` with interleaving (Korthikanti 2022
    §4.2.3; Megatron ``theoretical_memory_usage.py``)."""

    name: str = "in_flight_microbatches"
    category: str = "activations"
    depends_on: tuple[str, ...] = ("pp", "vpp", "grad_accum")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        pp, vpp, grad_accum = _axes(grid, "pp", "vpp", "grad_accum")
        base = np.minimum(pp, grad_accum)
        interleaved = 1.0 + (pp - 1.0) / (pp * vpp)
        return base * np.where(vpp > 1, interleaved, 1.0)


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
        tp, pp, vpp, cp, mbs = _axes(grid, "tp", "pp", "vpp", "cp", "mbs")
        size = mbs * ctx.training.seq_len / cp * ctx.model.hidden_size * BYTES_BF16
        split = np.where((np.asarray(grid["sp"]) == 1) | self.scatter_gather, tp, 1.0)
        nodes = pp_neighbour_num_nodes(pp, ctx.training.num_gpus, ctx.cluster.gpus_per_node)
        one = ctx.comm.time_s("send_recv", size / split, num_ranks=2.0, num_nodes=nodes)
        overlap = ctx.training.stack.pp_comm_overlap
        exposed = np.where((vpp > 1) & overlap, PP_OVERLAP_EXPOSED, 1.0)
        return np.where(pp > 1, 2.0 * vpp * one * exposed, 0.0)
