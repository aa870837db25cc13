"""Per-step terms: gradient synchronisation over data parallelism, the optimizer update, and the
per-micro-batch sharded-gradient / ZeRO-3 parameter traffic (expert all-to-alls:
``communication.EpCommTime``).

Gradients are reduced over the DP·CP group (Megatron ``data_parallel_group_with_cp``), whose
``num_gpus/(tp*pp)`` ranks are ``tp`` apart (``placement.py``), in the stack's gradient dtype
(``TrainingSpec.grad_precision``: FP32 ``main_grad`` in Megatron-LM, BF16 in NeMo). Per ZeRO
stage (Rajbhandari et al. 2020, "ZeRO", §5; Megatron ``distributed/param_and_grad_buffer.py``;
DeepSpeed ``stage_1_and_2.py``; PyTorch FSDP):

- 0 (DDP): one all-reduce of the gradients per step;
- 1 (distributed optimizer): one reduce-scatter of the gradients and one all-gather of the
  updated BF16 parameters per step;
- 2 (sharded gradients): the gradient buffer holds only this rank's shard, so every
  micro-batch's gradients are reduce-scattered as they are produced (DeepSpeed stage 2
  reduces each micro-step); the parameters are all-gathered once per step;
- 3 (FSDP): parameters are all-gathered before the forward and again before the backward of
  every micro-batch, and the gradients reduce-scattered after it.

Overlap (``StackSpec.overlap_grad_reduce`` / ``overlap_param_gather``, Megatron
``--overlap-grad-reduce --overlap-param-gather``, FSDP prefetch): the buckets overlap with the
backward / forward they follow or feed; ``DP_OVERLAP_EXPOSED`` of the time stays on the critical
path (the last bucket, the first gather). Routed-expert gradients are reduced over expert-DP
(``num_gpus/(etp*ep*pp)`` ranks, ``etp*ep`` apart). Per-micro-batch traffic is a micro-batch term,
so it is also counted in the pipeline-bubble slots (an upper bound with ``pp > 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.costs.terms import Grid, TermContext
from cost_models.compute import HBM_EFFICIENCY
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


def _exposed(overlap: bool) -> float:
    return DP_OVERLAP_EXPOSED if overlap else 1.0


def _overlaps(overlap: bool | None, ctx: TermContext) -> tuple[bool, bool]:
    """(grad-reduce, param-gather) overlap: a term's own setting for both, else the stack's."""
    stack = ctx.training.stack
    if overlap is not None:
        return overlap, overlap
    return stack.overlap_grad_reduce, stack.overlap_param_gather


def step_sync_time_s(
    params: np.ndarray,
    zero: np.ndarray,
    *,
    ranks: np.ndarray,
    nodes: np.ndarray,
    ctx: TermContext,
    overlap: bool | None = None,
) -> np.ndarray:
    """Exposed once-per-step gradient / parameter traffic of ``params`` per ZeRO stage (module
    docstring): all-reduce (0), reduce-scatter + all-gather (1), all-gather (2), nothing (3)."""
    grad_overlap, param_overlap = _overlaps(overlap, ctx)
    grads = params * ctx.training.grad_bytes
    all_reduce = ctx.comm.time_s("all_reduce", grads, num_ranks=ranks, num_nodes=nodes)
    scatter = ctx.comm.time_s("reduce_scatter", grads, num_ranks=ranks, num_nodes=nodes)
    gather = ctx.comm.time_s("all_gather", params * BYTES_WEIGHT, num_ranks=ranks, num_nodes=nodes)
    reduce_exposed = _exposed(grad_overlap)
    gather_exposed = _exposed(param_overlap)
    zero = np.asarray(zero)
    return np.select(
        [zero == 0, zero == 1, zero == 2],
        [
            all_reduce * reduce_exposed,
            scatter * reduce_exposed + gather * gather_exposed,
            gather * gather_exposed,
        ],
        default=0.0,
    )


def microbatch_sync_time_s(
    params: np.ndarray,
    zero: np.ndarray,
    *,
    ranks: np.ndarray,
    nodes: np.ndarray,
    ctx: TermContext,
    overlap: bool | None = None,
) -> np.ndarray:
    """Exposed per-micro-batch traffic: the gradient reduce-scatter (ZeRO >= 2) and the forward
    and backward parameter all-gathers (ZeRO 3)."""
    grad_overlap, param_overlap = _overlaps(overlap, ctx)
    grads = params * ctx.training.grad_bytes
    scatter = ctx.comm.time_s("reduce_scatter", grads, num_ranks=ranks, num_nodes=nodes)
    gather = ctx.comm.time_s("all_gather", params * BYTES_WEIGHT, num_ranks=ranks, num_nodes=nodes)
    zero = np.asarray(zero)
    reduce = np.where(zero >= 2, scatter * _exposed(grad_overlap), 0.0)
    gathers = np.where(zero >= 3, 2.0 * gather * _exposed(param_overlap), 0.0)
    return reduce + gathers


def _dense_group(grid: Grid, ctx: TermContext) -> tuple[np.ndarray, ...]:
    tp, pp, zero = _axes(grid, "tp", "pp", "zero")
    params = first_stage_dense_params(ctx.model, tp, pp)
    ranks = ctx.training.num_gpus / (tp * pp)
    nodes = group_num_nodes(ranks, tp, ctx.cluster.gpus_per_node)
    return params, zero, ranks, nodes


def _expert_group(grid: Grid, ctx: TermContext) -> tuple[np.ndarray, ...]:
    pp, ep, etp, zero = _axes(grid, "pp", "ep", "etp", "zero")
    model = ctx.model
    params = stage_layers(model.num_moe_layers, pp) * expert_params(model) / (ep * etp)
    ranks = ctx.training.num_gpus / (etp * ep * pp)
    nodes = group_num_nodes(ranks, etp * ep, ctx.cluster.gpus_per_node)
    return params, zero, ranks, nodes


@dataclass(frozen=True, slots=True, kw_only=True)
class DpCommTime:
    """Exposed once-per-step dense-gradient synchronisation over DP·CP (module docstring)."""

    name: str = "dp_comm_s"
    category: str = "dp_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "zero")

    overlap: bool | None = None
    """Both DP overlaps on or off; ``None``: as the stack says."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        params, zero, ranks, nodes = _dense_group(grid, ctx)
        return step_sync_time_s(
            params, zero, ranks=ranks, nodes=nodes, ctx=ctx, overlap=self.overlap
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertDpCommTime:
    """Exposed once-per-step routed-expert gradient synchronisation over expert-DP; zero for
    dense models."""

    name: str = "expert_dp_comm_s"
    category: str = "dp_comm"
    depends_on: tuple[str, ...] = ("pp", "ep", "etp", "zero")

    overlap: bool | None = None
    """Both DP overlaps on or off; ``None``: as the stack says."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        if not ctx.model.is_moe:
            return np.zeros(len(grid["pp"]))
        params, zero, ranks, nodes = _expert_group(grid, ctx)
        return step_sync_time_s(
            params, zero, ranks=ranks, nodes=nodes, ctx=ctx, overlap=self.overlap
        )


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
    """Per-micro-batch sharded-data-parallel traffic of the dense parameters: the gradient
    reduce-scatter with ZeRO >= 2 and the two parameter all-gathers with ZeRO 3 (module
    docstring). Zero below stage 2."""

    name: str = "fsdp_gather_s"
    category: str = "dp_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "zero")
    overlap: bool | None = None
    """Both DP overlaps on or off; ``None``: as the stack says."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        params, zero, ranks, nodes = _dense_group(grid, ctx)
        return microbatch_sync_time_s(
            params, zero, ranks=ranks, nodes=nodes, ctx=ctx, overlap=self.overlap
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertFsdpTime:
    """``FsdpGatherTime`` for the routed-expert parameters over expert-DP; zero for dense
    models."""

    name: str = "expert_fsdp_s"
    category: str = "dp_comm"
    depends_on: tuple[str, ...] = ("pp", "ep", "etp", "zero")
    overlap: bool | None = None
    """Both DP overlaps on or off; ``None``: as the stack says."""

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        if not ctx.model.is_moe:
            return np.zeros(len(grid["pp"]))
        params, zero, ranks, nodes = _expert_group(grid, ctx)
        return microbatch_sync_time_s(
            params, zero, ranks=ranks, nodes=nodes, ctx=ctx, overlap=self.overlap
        )
