"""Collective-communication timing: the protocol every source of collective times follows.

Sizes follow the nccl-tests convention (nccl-tests `doc/PERFORMANCE.md`), so a measured log maps
onto the protocol without conversion:

- ``all_reduce``: ``size_bytes`` is the buffer every rank holds (input = output size).
- ``all_gather``: ``size_bytes`` is the gathered output, i.e. the sum over ranks of what each sends.
- ``reduce_scatter``: ``size_bytes`` is the input each rank holds (the sum of all output shards).
- ``all_to_all``: ``size_bytes`` is each rank's whole send buffer (all destinations together).
- ``send_recv``: ``size_bytes`` is what one rank sends to its peer.

Bus bandwidth factors (same source): ``busbw = algbw * f(n)`` with ``f = 2(n-1)/n`` for
all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter and all_to_all, ``1`` for send_recv.

Two implementations exist: ``DatasheetCollectives`` below, the alpha-beta model from the GPU
datasheet used when nothing was measured, and the profile fitted from nccl-tests logs in
``autopar/calibration/``. Both live on the core side of the cost-model seam: cost models read
collective times through ``TermContext.comm`` and never build their own.

Datasheet model. Bandwidth of a group that spans ``nodes`` nodes with ``k = ranks / nodes``
members per node:

- one node: NVLink, ``nvlink_bytes_per_s * NVLINK_EFFICIENCY`` of bus bandwidth;
- several nodes, ring collectives: each member drives its own NIC (rail-aligned DGX/HGX nodes,
  one NIC per GPU, NCCL opens one ring per NIC), so the bus bandwidth is
  ``min(NVLink, k * nic_bytes_per_s * NIC_EFFICIENCY)``: a DP group with one rank per node gets
  one NIC, a group with all eight GPUs of each node gets eight;
- all-to-all: each rank sends ``(k-1)/n`` of its buffer over NVLink and ``(n-k)/n`` through its
  own NIC, concurrently: the slower of the two;
- send/recv: one NVLink or one NIC.

Time = latency + size * busbw_factor / bandwidth (nccl-tests ``busbw = algbw * f(n)``, the
factor from ``autopar.costs.comm.bus_bandwidth_factor``). Latency: one cluster latency per
intra-node ring step ``(k-1)`` plus one per inter-node tree level ``ceil(log2(nodes))`` (NCCL
switches to tree / NVLS-tree algorithms across nodes at scale), doubled for all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from autopar.inputs.specs import ClusterSpec

COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
)


def bus_bandwidth_factor(collective: str, num_ranks: np.ndarray | int) -> np.ndarray:
    """nccl-tests bus-bandwidth factor f(n) (nccl-tests doc/PERFORMANCE.md)."""
    n = np.asarray(num_ranks, dtype=np.float64)
    if collective == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1.0) / n
    if collective == "send_recv":
        return np.ones_like(n)
    raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")


@runtime_checkable
class CollectiveModel(Protocol):
    """Predicts the time of one collective call.

    All arguments broadcast against each other (numpy arrays); the result has their shape.
    ``num_ranks`` is the group size; ``num_nodes`` how many nodes the group spans (1 = NVLink only).
    A group of one rank, or a zero-byte message, takes zero time.
    """

    def time_s(
        self,
        collective: str,
        size_bytes: np.ndarray,
        *,
        num_ranks: np.ndarray,
        num_nodes: np.ndarray,
    ) -> np.ndarray: ...


def collective_sources(comm: CollectiveModel) -> dict[str, str] | None:
    """Where a collective model's times come from, per collective and span, when it says
    (a measured profile's ``provenance()``: ``measured``, ``derived from ...``, ``datasheet``);
    ``None`` for models that do not (the datasheet model, a plug-in's own)."""
    provenance = getattr(comm, "provenance", None)
    return provenance() if callable(provenance) else None


NVLINK_EFFICIENCY = 0.80
"""Achievable fraction of per-direction NVLink bandwidth as NCCL bus bandwidth: nccl-tests
all_reduce on DGX A100 peaks near 230-240 GB/s of 300, on DGX H100 near 360-380 of 450."""
NIC_EFFICIENCY = 0.90
"""Achievable fraction of the NIC line rate: nccl-tests across HDR/NDR InfiniBand reach ~90%
(e.g. ~22-23 GB/s per 200 Gb/s HDR port)."""


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
