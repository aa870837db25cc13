"""Per-step terms: gradient synchronisation over data parallelism, the optimizer update, and the
per-micro-batch expert all-to-all and ZeRO-3 parameter gathers.

Gradients are reduced over the DP·CP group (Megatron ``data_parallel_group_with_cp``), whose
``num_gpus/(tp*pp)`` ranks are ``tp`` apart (``placement.py``). Megatron accumulates and reduces
BF16-trained gradients in FP32 (``accumulate_allreduce_grads_in_fp32``): an all-reduce of
4 B/param, or with the distributed optimizer a reduce-scatter of 4 B/param and an all-gather of
the updated BF16 parameters (2 B/param) (Megatron ``distributed/param_and_grad_buffer.py``).
With ``--overlap-grad-reduce --overlap-param-gather`` the buckets overlap with the last
micro-batch's backward and the first one's forward; ``DP_OVERLAP_EXPOSED`` of the time stays on
the critical path (the last bucket, the first gather). Routed-expert gradients are reduced over
expert-DP (``num_gpus/(etp*ep*pp)`` ranks, ``etp*ep`` apart).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.terms import Grid, TermContext
from cost_models.compute import HBM_EFFICIENCY
from cost_models.flops import RECOMPUTE_FULL
from cost_models.memory import first_stage_dense_params
from cost_models.placement import group_num_nodes
from cost_models.shapes import expert_params, stage_layers

DP_OVERLAP_EXPOSED = 0.2
"""Share of the gradient reduce-scatter / parameter all-gather left exposed with Megatron's
overlap flags (last bucket + first gather; 40 MB buckets over GB of gradients)."""
ADAM_BYTES_PER_PARAM = 30.0
"""HBM traffic of one fused Adam update per parameter: read FP32 master, m, v, grad (16 B), write
master, m, v (12 B) and the BF16 weight (2 B) (Apex/TE ``FusedAdam``; memory bound)."""
BYTES_WEIGHT = 2.0


def _axes(grid: Grid, *names: str) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(grid[name], dtype=np.float64) for name in names)


def sync_time_s(
    params: np.ndarray, zero: np.ndarray, *, ranks: np.ndarray, nodes: np.ndarray, ctx: TermContext
) -> np.ndarray:
    """All-reduce of the gradients (FP32 or BF16: ``TrainingSpec.grad_precision``), or
    reduce-scatter + BF16 parameter all-gather (``zero >= 1``)."""
    grads = params * ctx.training.grad_bytes
    all_reduce = ctx.comm.time_s("all_reduce", grads, num_ranks=ranks, num_nodes=nodes)
    scatter = ctx.comm.time_s("reduce_scatter", grads, num_ranks=ranks, num_nodes=nodes)
    gather = ctx.comm.time_s("all_gather", params * BYTES_WEIGHT, num_ranks=ranks, num_nodes=nodes)
    # ZeRO-3 gathers parameters per micro-batch (FsdpGatherTime), not once per step.
    gather = np.where(zero >= 3, 0.0, gather)
    return np.where(zero >= 1, scatter + gather, all_reduce)


@dataclass(frozen=True, slots=True, kw_only=True)
class DpCommTime:
    """Exposed dense-gradient synchronisation of one step over DP·CP (module docstring)."""

    name: str = "dp_comm_s"
    category: str = "dp_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "zero")
    overlap: bool = False
    """Megatron ``--overlap-grad-reduce --overlap-param-gather``."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, zero = _axes(grid, "tp", "pp", "zero")
        params = first_stage_dense_params(ctx.model, tp, pp)
        ranks = ctx.training.num_gpus / (tp * pp)
        nodes = group_num_nodes(ranks, tp, ctx.cluster.gpus_per_node)
        total = sync_time_s(params, zero, ranks=ranks, nodes=nodes, ctx=ctx)
        return total * (DP_OVERLAP_EXPOSED if self.overlap else 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertDpCommTime:
    """Exposed routed-expert gradient synchronisation over expert-DP; zero for dense models."""

    name: str = "expert_dp_comm_s"
    category: str = "dp_comm"
    depends_on: tuple[str, ...] = ("pp", "ep", "etp", "zero")
    overlap: bool = False

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        pp, ep, etp, zero = _axes(grid, "pp", "ep", "etp", "zero")
        model = ctx.model
        if not model.is_moe:
            return np.zeros(len(pp))
        params = stage_layers(model.num_moe_layers, pp) * expert_params(model) / (ep * etp)
        ranks = ctx.training.num_gpus / (etp * ep * pp)
        nodes = group_num_nodes(ranks, etp * ep, ctx.cluster.gpus_per_node)
        total = sync_time_s(params, zero, ranks=ranks, nodes=nodes, ctx=ctx)
        return total * (DP_OVERLAP_EXPOSED if self.overlap else 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerStepTime:
    """Adam update of this rank's parameter shard: ``ADAM_BYTES_PER_PARAM`` through HBM; the
    shard is ``1/(dp*cp)`` of the stage's dense parameters with the distributed optimizer
    (ZeRO >= 1) and ``1/expert_dp`` of its expert parameters."""

    name: str = "optimizer_step_s"
    category: str = "optimizer"
    depends_on: tuple[str, ...] = ("tp", "pp", "ep", "etp", "zero")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, ep, etp, zero = _axes(grid, "tp", "pp", "ep", "etp", "zero")
        model, num_gpus = ctx.model, ctx.training.num_gpus
        dense = first_stage_dense_params(model, tp, pp)
        dense = dense / np.where(zero >= 1, num_gpus / (tp * pp), 1.0)
        experts = stage_layers(model.num_moe_layers, pp) * expert_params(model) / (ep * etp)
        experts = experts / np.where(zero >= 1, num_gpus / (etp * ep * pp), 1.0)
        hbm = ctx.cluster.gpu.hbm_bytes_per_s * HBM_EFFICIENCY
        return (dense + experts) * ADAM_BYTES_PER_PARAM / hbm


@dataclass(frozen=True, slots=True, kw_only=True)
class FsdpGatherTime:
    """ZeRO-3: the stage's BF16 weights are all-gathered for the forward and again for the
    backward of every micro-batch (FSDP / DeepSpeed stage 3), prefetched one layer ahead:
    ``DP_OVERLAP_EXPOSED`` of it stays exposed. Zero below stage 3."""

    name: str = "fsdp_gather_s"
    category: str = "dp_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "zero")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, zero = _axes(grid, "tp", "pp", "zero")
        params = first_stage_dense_params(ctx.model, tp, pp)
        ranks = ctx.training.num_gpus / (tp * pp)
        nodes = group_num_nodes(ranks, tp, ctx.cluster.gpus_per_node)
        gather = ctx.comm.time_s(
            "all_gather", params * BYTES_WEIGHT, num_ranks=ranks, num_nodes=nodes
        )
        return np.where(zero >= 3, 2.0 * DP_OVERLAP_EXPOSED * gather, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class EpCommTime:
    """Expert-parallel all-to-alls of one stage, one micro-batch: dispatch and combine forward,
    the same backward (and again forward under full recompute), each rank sending its
    ``mbs*s/(tp*cp) * top_k`` routed token copies of ``h`` BF16 elements (Megatron
    ``token_dispatcher.py``, alltoall dispatcher). EP ranks are ``etp`` apart. Not overlapped."""

    name: str = "ep_comm_s"
    category: str = "ep_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "mbs", "recompute")

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        tp, pp, cp, ep, etp, mbs = _axes(grid, "tp", "pp", "cp", "ep", "etp", "mbs")
        model = ctx.model
        if not model.is_moe:
            return np.zeros(len(tp))
        copies = mbs * ctx.training.seq_len / (tp * cp) * model.experts_per_token
        size = copies * model.hidden_size * BYTES_WEIGHT
        nodes = group_num_nodes(ep, etp, ctx.cluster.gpus_per_node)
        one = ctx.comm.time_s("all_to_all", size, num_ranks=ep, num_nodes=nodes)
        calls = 4.0 + 2.0 * (np.asarray(grid["recompute"]) == RECOMPUTE_FULL)
        return stage_layers(model.num_moe_layers, pp) * calls * one
