"""Collective times from the datasheet, and the TP / CP / DP / EP communication terms.

``DatasheetCollectives`` is the alpha-beta model behind ``autopar.comm.CollectiveModel`` when no
measured profile is given (``autopar/calibration/`` fits one from nccl-tests logs and replaces it
through ``ctx.comm``). Sizes follow the nccl-tests conventions of ``autopar.comm``.

Bandwidth of a group that spans ``nodes`` nodes with ``k = ranks / nodes`` members per node:

- one node: NVLink, ``nvlink_bytes_per_s * NVLINK_EFFICIENCY`` of bus bandwidth;
- several nodes, ring collectives: each member drives its own NIC (rail-aligned DGX/HGX nodes,
  one NIC per GPU, NCCL opens one ring per NIC), so the bus bandwidth is
  ``min(NVLink, k * nic_bytes_per_s * NIC_EFFICIENCY)``: a DP group with one rank per node gets
  one NIC, a group with all eight GPUs of each node gets eight;
- all-to-all: each rank sends ``(k-1)/n`` of its buffer over NVLink and ``(n-k)/n`` through its
  own NIC, concurrently: the slower of the two;
- send/recv: one NVLink or one NIC.

Time = latency + size * busbw_factor / bandwidth (nccl-tests ``busbw = algbw * f(n)``, the
factor from ``autopar.comm.bus_bandwidth_factor``). Latency: one cluster latency per intra-node
ring step ``(k-1)`` plus one per inter-node tree level ``ceil(log2(nodes))`` (NCCL switches to
tree / NVLS-tree algorithms across nodes at scale), doubled for all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.comm import bus_bandwidth_factor
from autopar.specs import ClusterSpec
from autopar.terms import Grid, TermContext
from cost_models.compute import FLASH_BACKWARD_SLOWDOWN, attention_core_time_s
from cost_models.flops import RECOMPUTE_FULL
from cost_models.placement import group_num_nodes
from cost_models.shapes import kv_size, stage_layers

NVLINK_EFFICIENCY = 0.80
"""Achievable fraction of per-direction NVLink bandwidth as NCCL bus bandwidth: nccl-tests
all_reduce on DGX A100 peaks near 230-240 GB/s of 300, on DGX H100 near 360-380 of 450."""
NIC_EFFICIENCY = 0.90
"""Achievable fraction of the NIC line rate: nccl-tests across HDR/NDR InfiniBand reach ~90%
(e.g. ~22-23 GB/s per 200 Gb/s HDR port)."""
BYTES_BF16 = 2.0
BYTES_FP32 = 4.0


@dataclass(frozen=True, slots=True)
class DatasheetCollectives:
    """Alpha-beta collective times from the GPU datasheet (module docstring)."""

    cluster: ClusterSpec

    def time_s(
        self,
        collective: str,
        size_bytes: np.ndarray,
        *,
        num_ranks: np.ndarray,
        num_nodes: np.ndarray,
    ) -> np.ndarray:
        size = np.asarray(size_bytes, dtype=np.float64)
        n = np.maximum(np.asarray(num_ranks, dtype=np.float64), 1.0)
        nodes = np.clip(np.asarray(num_nodes, dtype=np.float64), 1.0, n)
        per_node = n / nodes
        gpu = self.cluster.gpu
        nvlink = gpu.nvlink_bytes_per_s * NVLINK_EFFICIENCY
        nic = gpu.nic_bytes_per_s * NIC_EFFICIENCY
        inter = nodes > 1.0
        latency = self.cluster.intra_node_latency_s * (
            per_node - 1.0
        ) + self.cluster.inter_node_latency_s * np.ceil(np.log2(nodes))
        if collective == "all_to_all":
            wire = np.maximum(size * (per_node - 1.0) / n / nvlink, size * (n - per_node) / n / nic)
        elif collective == "send_recv":
            wire = size / np.where(inter, nic, nvlink)
            latency = np.where(
                inter, self.cluster.inter_node_latency_s, self.cluster.intra_node_latency_s
            )
        else:
            bandwidth = np.where(inter, np.minimum(nvlink, per_node * nic), nvlink)
            wire = size * bus_bandwidth_factor(collective, n) / bandwidth
            latency = latency * (2.0 if collective == "all_reduce" else 1.0)
        return np.where((n <= 1.0) | (size <= 0.0), 0.0, latency + wire)


def _axes(grid: Grid, *names: str) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(grid[name], dtype=np.float64) for name in names)


TP_OVERLAP_EXPOSED = 0.25
"""Share of TP collectives left exposed with Megatron ``--tp-comm-overlap`` (Transformer Engine
userbuffers pipeline the all-gather / reduce-scatter with the adjacent GEMM chunks; the first
and last chunks and the SM contention stay visible). Calibrated on the 2024 Megatron / NeMo rows."""


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
