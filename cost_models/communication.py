"""The TP and CP communication terms.

Collective times come from ``ctx.comm`` (``autopar.comm.CollectiveModel``): the datasheet
alpha-beta model ``autopar.comm.DatasheetCollectives`` by default, or a profile fitted from
nccl-tests logs (``autopar/calibration/``). Sizes follow the nccl-tests conventions of
``autopar.comm``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.terms import Grid, TermContext
from cost_models.compute import FLASH_BACKWARD_SLOWDOWN, attention_core_time_s
from cost_models.flops import RECOMPUTE_FULL
from cost_models.placement import group_num_nodes
from cost_models.shapes import kv_size, stage_layers

BYTES_BF16 = 2.0


def _axes(grid: Grid, *names: str) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(grid[name], dtype=np.float64) for name in names)


TP_OVERLAP_EXPOSED = 0.25
"""Share of TP collectives left exposed with Megatron ``--tp-comm-overlap`` (Transformer Engine
userbuffers pipeline the all-gather / reduce-scatter with the adjacent GEMM chunks; the first
and last chunks and the SM contention stay visible). A fixed engineering estimate, not fitted
(benchmarks/README.md lists it among the fixed constants); it moves only the rows that ran with
TP overlap (the 2024 Megatron README and NeMo 24.07 rows)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TpCommTime:
    """Tensor-parallel collectives of one stage, one micro-batch (Narayanan et al. 2021 §3.3;
    Korthikanti et al. 2022 §4.2.2). Per layer, on the activation tensor ``mbs*s/cp*h`` in BF16:
    with SP 2 all-gathers + 2 reduce-scatters forward and the same backward; without SP
    2 all-reduces forward and 2 backward. Full recompute repeats the forward ones. TP ranks are
    consecutive, so the group spans ``ceil(tp / gpus_per_node)`` nodes."""

    name: str = "tp_comm_s"
    category: str = "tp_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute", "sp")
    overlap: bool = False
    """Megatron ``--tp-comm-overlap``: only ``TP_OVERLAP_EXPOSED`` of the time stays exposed."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, cp, mbs = _axes(grid, "tp", "pp", "cp", "mbs")
        size = mbs * ctx.training.seq_len / cp * ctx.model.hidden_size * BYTES_BF16
        nodes = group_num_nodes(tp, 1.0, ctx.cluster.gpus_per_node)
        ag = ctx.comm.time_s("all_gather", size, num_ranks=tp, num_nodes=nodes)
        rs = ctx.comm.time_s("reduce_scatter", size, num_ranks=tp, num_nodes=nodes)
        ar = ctx.comm.time_s("all_reduce", size, num_ranks=tp, num_nodes=nodes)
        forward = np.where(grid["sp"] == 1, 2.0 * (ag + rs), 2.0 * ar)
        recompute = np.where(grid["recompute"] == RECOMPUTE_FULL, 1.0, 0.0)
        per_layer = forward * (2.0 + recompute)
        exposed = TP_OVERLAP_EXPOSED if self.overlap else 1.0
        return exposed * stage_layers(ctx.model.num_layers, pp) * per_layer


@dataclass(frozen=True, slots=True, kw_only=True)
class CpCommTime:
    """Context-parallel ring attention, one stage, one micro-batch (Megatron-Core
    ``ring_attention`` / Transformer Engine ``AttnFuncWithCPAndKVP2P``): ``cp-1`` steps, each
    passing this rank's K and V chunk (``2*mbs*s/cp*kv/tp`` elements) to the next rank, forward;
    backward passes K, V and their gradients (twice the bytes). Each step overlaps with the
    attention of one chunk; only the excess is exposed. CP stride is ``tp``."""

    name: str = "cp_comm_s"
    category: str = "cp_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute")
    flash_attention: bool = True

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, cp, mbs = _axes(grid, "tp", "pp", "cp", "mbs")
        model, s = ctx.model, ctx.training.seq_len
        tokens = mbs * s / cp
        chunk = 2.0 * tokens * kv_size(model) / tp * BYTES_BF16
        nodes = group_num_nodes(cp, tp, ctx.cluster.gpus_per_node)
        step = ctx.comm.time_s("send_recv", chunk, num_ranks=2.0 * (cp > 1), num_nodes=nodes)
        core = attention_core_time_s(
            model,
            tokens=tokens,
            seq_len=s,
            tp=tp,
            mbs=mbs,
            flash_attention=self.flash_attention,
            ctx=ctx,
        )
        core_step = core / np.maximum(cp, 1.0)
        forward = (cp - 1.0) * np.maximum(step - core_step, 0.0)
        backward = (cp - 1.0) * np.maximum(
            2.0 * step - 2.0 * FLASH_BACKWARD_SLOWDOWN * core_step, 0.0
        )
        recompute = np.where(grid["recompute"] == RECOMPUTE_FULL, 1.0, 0.0)
        return stage_layers(model.num_layers, pp) * (forward * (1.0 + recompute) + backward)
