"""Activation CPU offloading (``StackSpec.cpu_offload_layers``; Megatron ``--cpu-offloading
--cpu-offloading-num-layers``, Transformer Engine ``cpu_offload.py``): the offloaded layers'
activations leave the GPU in the forward and come back in the backward, on a side stream that
overlaps the compute. Memory: ``activations.offload_share``. Time: this term, the transfers over the
GPU-host link (``GpuSpec.host_bytes_per_s``: PCIe on x86 hosts, NVLink-C2C to Grace on
GB200 / GB300; Megatron-Bridge's performance guide: "the efficiency of activation offloading
depends on both the interconnect bandwidth between the GPU and host and the host memory
bandwidth ... Grace-based systems like the GB200 enhance offloading performance")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.costs.terms import Grid, TermContext
from cost_models.activations import ExpertActivationMemory, LayerActivationMemory, offload_share
from cost_models.data_parallel import DP_OVERLAP_EXPOSED

OFFLOAD_EXPOSED = DP_OVERLAP_EXPOSED
"""Share of the offload and reload transfers left on the critical path (the first layer's
offload and the last layer's reload have no compute to hide behind). Not fitted: the share the
other overlapped transfers use (``data_parallel.DP_OVERLAP_EXPOSED``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadTime:
    """Exposed activation offload (forward, GPU to host) and reload (backward, host to GPU) of
    one micro-batch: the offloaded bytes, each way, over ``host_bytes_per_s``, times
    ``OFFLOAD_EXPOSED``. Zero without offloading. ``activations``: the cost model's own
    activation terms (``default_cost_model`` passes them, so their overrides apply here too);
    empty, the default ones."""

    name: str = "cpu_offload_s"
    category: str = "offload"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute", "sp")
    activations: tuple[LayerActivationMemory | ExpertActivationMemory, ...] = ()

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        host = ctx.cluster.gpu.host_bytes_per_s
        share = offload_share(ctx)
        if not ctx.training.stack.cpu_offload_layers or host is None or share <= 0.0:
            return np.zeros(len(grid["tp"]))
        terms = self.activations or (LayerActivationMemory(), ExpertActivationMemory())
        kept = sum(term.evaluate(grid, ctx) for term in terms)
        moved = kept * (1.0 - share) / share
        return 2.0 * OFFLOAD_EXPOSED * moved / host
