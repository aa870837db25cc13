"""The default cost model: the terms of DESIGN §4, composed as ``autopar.costs.terms`` describes.

    step_time_s  = dp_comm + expert_dp_comm + optimizer_step
                   + slots * (dense_compute + expert_compute + logits_compute
                              + tp_comm + cp_comm + pp_comm + ep_comm + fsdp_gather)
    memory_bytes = dense/expert weights, gradients, optimizer + logits + recompute workspace
                   + workspace + in_flight * (layer activations + expert activations)

What the software stack does (fused attention, TP / DP / PP / CP / EP communication overlap, the
FP8 recipe, dropout, the gradient dtype) is an input, ``autopar.inputs.stack.StackSpec``, that the
terms read from ``ctx.training.stack``. ``default_cost_model()`` can still pin a few switches for
every job (``flash_attention``, ``tp_comm_overlap``, ``dp_comm_overlap``), and
``megatron_compatible`` reproduces Megatron's ``theoretical_memory_usage.py`` arithmetic for the
memory terms.
"""

from __future__ import annotations

from autopar.costs.terms import CostModel
from cost_models.activations import (
    ExpertActivationMemory,
    LayerActivationMemory,
    RecomputeWorkspaceMemory,
)
from cost_models.checkpoint import CheckpointBytes
from cost_models.communication import CpCommTime, DispatcherDecision, EpCommTime, TpCommTime
from cost_models.compute import (
    MOE_LOAD_IMBALANCE,
    DenseComputeTime,
    ExpertComputeTime,
    LogitsComputeTime,
)
from cost_models.data_parallel import (
    DpCommTime,
    ExpertDpCommTime,
    ExpertFsdpTime,
    FsdpGatherTime,
    OptimizerStepTime,
)
from cost_models.flops import TransformerFlops
from cost_models.memory import DenseParamMemory, ExpertParamMemory, LogitsMemory, WorkspaceMemory
from cost_models.offload import OffloadTime
from cost_models.pipeline import InFlightMicrobatches, PipelineSlots, PpCommTime


def default_cost_model(
    *,
    flash_attention: bool | None = None,
    tp_comm_overlap: bool | None = None,
    dp_comm_overlap: bool | None = None,
    megatron_compatible: bool = False,
    moe_dispatcher: str | None = None,
    moe_ep_overlap: bool | None = None,
    moe_shared_expert_overlap: bool = False,
    moe_load_imbalance: float = MOE_LOAD_IMBALANCE,
    moe_capacity_factor: float | None = None,
) -> CostModel:
    """The default terms. The switches default to ``None``: each term then reads the job's
    stack (``TrainingSpec.stack``, ``autopar.inputs.stack``; ``--stack`` and the per-switch flags);
    a value given here overrides the stack for every job this cost model scores. The ``moe_*``
    switches are Megatron's MoE flags: ``--moe-token-dispatcher-type`` (``None``: the
    fastest the stack allows, reported as a decision; ``"best"``: the fastest of all),
    ``--overlap-moe-expert-parallel-comm`` (``None``: the stack's ``ep_comm_overlap``),
    ``--moe-shared-expert-overlap``, ``--moe-expert-capacity-factor``, and the dropless load
    imbalance (``ExpertComputeTime``)."""
    compat = megatron_compatible
    static_memory = (
        DenseParamMemory(part="weights", megatron_compatible=compat),
        DenseParamMemory(part="gradients", megatron_compatible=compat),
        DenseParamMemory(part="optimizer", megatron_compatible=compat),
        ExpertParamMemory(part="weights"),
        ExpertParamMemory(part="gradients"),
        ExpertParamMemory(part="optimizer"),
    )
    if not compat:
        static_memory = (
            *static_memory,
            LogitsMemory(),
            RecomputeWorkspaceMemory(flash_attention=flash_attention),
            WorkspaceMemory(),
        )
    microbatch_memory = (
        LayerActivationMemory(flash_attention=flash_attention, megatron_compatible=compat),
        ExpertActivationMemory(),
    )
    return CostModel(
        name="megatron-compatible" if compat else "default",
        step_terms=(
            DpCommTime(overlap=dp_comm_overlap),
            ExpertDpCommTime(overlap=dp_comm_overlap),
            OptimizerStepTime(),
        ),
        microbatch_terms=(
            DenseComputeTime(flash_attention=flash_attention),
            ExpertComputeTime(
                load_imbalance=moe_load_imbalance,
                capacity_factor=moe_capacity_factor,
                dispatcher=moe_dispatcher,
                ep_overlap=moe_ep_overlap,
            ),
            LogitsComputeTime(),
            TpCommTime(overlap=tp_comm_overlap),
            CpCommTime(flash_attention=flash_attention),
            PpCommTime(),
            EpCommTime(
                dispatcher=moe_dispatcher,
                ep_overlap=moe_ep_overlap,
                shared_expert_overlap=moe_shared_expert_overlap,
            ),
            FsdpGatherTime(overlap=dp_comm_overlap),
            ExpertFsdpTime(overlap=dp_comm_overlap),
            OffloadTime(activations=microbatch_memory),
        ),
        slots=PipelineSlots(),
        static_memory_terms=static_memory,
        microbatch_memory_terms=microbatch_memory,
        in_flight=InFlightMicrobatches(),
        flops=TransformerFlops(),
        decisions=DispatcherDecision(dispatcher=moe_dispatcher),
        checkpoint=CheckpointBytes(),
    )


def megatron_compatible_cost_model() -> CostModel:
    """The default terms with Megatron's ``theoretical_memory_usage.py`` memory arithmetic
    (``--cost-model megatron-compatible``)."""
    return default_cost_model(megatron_compatible=True)
