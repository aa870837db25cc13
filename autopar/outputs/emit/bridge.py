"""Megatron-Bridge (NeMo 2 successor): Hydra-style ``section.key=value`` overrides of a recipe's
``ConfigContainer`` for a layout (DESIGN §7).

Target: Megatron-Bridge 0.6.2 (PyPI, current) on megatron-core 0.19.2, where a run is
``scripts/training/run_recipe.py --recipe R`` plus these overrides, applied by
``training/utils/omegaconf_utils.py`` ``process_config_with_overrides`` (Hydra's override parser
on the struct config) and followed by the runner's sync steps (``recipe_runner.py``
``sync_model_pipeline_layout``, ``sync_model_dataset_sequence_length``). What 0.6 changed, and
each override here follows:

- the dataset's length is ``dataset.seq_length`` (``sequence_length`` is still accepted as an
  alias, but ``model.seq_length`` is then re-synced to the unchanged ``seq_length``: the job
  would train at the recipe's length);
- a recipe may have no ``comm_overlap`` section (``recipes/common.py`` ``_pretrain_common``:
  ``comm_overlap=None``) or one with overlaps on (the Llama-3 70B recipe): ``comm_overlap=null``
  when the plan overlaps nothing, else ``++comm_overlap._target_=...CommOverlapConfig`` and
  ``++comm_overlap.key=value`` (a config built anew, ``omegaconf_utils._apply_overrides``),
  valid whichever recipe the overrides are applied to;
- a recipe's pipeline layout (DeepSeek-V3's, ``set_deepseek_v3_pipeline_model_parallel_layout``)
  is re-built after a PP/VPP override unless the layout itself is overridden:
  ``model.pipeline_model_parallel_layout=null`` keeps the split autopar planned;
- ``moe_shared_expert_overlap`` (set by the DeepSeek-V2 recipes) works only with the alltoall
  and flex dispatchers (megatron-core ``transformer_config.py``): it is turned off where the plan
  uses allgather.

The model is written in full (shapes, ``autopar.outputs.emit.bridge_model`` for RoPE, norms,
biases, activation and router), so the overrides describe the planned model whichever recipe of
the family they start from. ``tests/test_bridge.py`` applies them with Bridge itself.
"""

from __future__ import annotations

from typing import Any

from autopar.inputs.specs import ModelSpec, Problem, TrainingSpec
from autopar.inputs.stack import DEFAULT_FP8_GEMMS, StackSpec
from autopar.layout.plan import Estimate, Layout
from autopar.outputs.emit.bridge_model import model_details
from autopar.outputs.emit.common import (
    MEGATRON_SCHEDULES,
    check_graphs_and_offload,
    checkpoint_interval_of,
    dispatcher_of,
    ffn_pattern,
    layout_of,
    refuse,
    refuse_schedule,
    selective_modules,
    split_of,
    unsupported_layers,
)

BRIDGE_TARGET = "Megatron-Bridge 0.6.2 (megatron-core 0.19.2)"


COMM_OVERLAP_CLASS = "megatron.bridge.training.comm_overlap.CommOverlapConfig"
OPTIONAL_SECTIONS = frozenset({"comm_overlap"})
"""``ConfigContainer`` sections a recipe may leave ``None`` (``recipes/common.py``): their keys
are written ``++section.key`` (set, or add when absent)."""


def _value(value: Any) -> str:
    """A Hydra override value: ``true``/``false``/``null``, numbers and bare strings."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _model_sizes(model: ModelSpec, seq_len: int) -> dict[str, Any]:
    sizes: dict[str, Any] = {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_query_groups": model.num_kv_heads,
        "kv_channels": model.kv_channels,
        "vocab_size": model.vocab_size,
        "seq_length": seq_len,
        "share_embeddings_and_output_weights": model.tied_embeddings,
        "add_bias_linear": model.linear_bias,
        "normalization": "LayerNorm" if model.layernorm else "RMSNorm",
        "position_embedding_type": "learned_absolute"
        if model.learned_position_embeddings
        else "rope",
    }
    missing = unsupported_layers(model)
    if missing:
        raise refuse(
            "megatron-bridge",
            f"{model.name}'s {', '.join(missing)}",
            "start from its Megatron-Bridge recipe unchanged",
        )
    if model.is_mla:  # MLATransformerConfig fields (DeepSeek / Kimi providers)
        sizes |= {
            "multi_latent_attention": True,
            "q_lora_rank": model.q_lora_rank or None,
            "kv_lora_rank": model.kv_lora_rank,
            "qk_head_dim": model.qk_nope_head_dim,
            "qk_pos_emb_head_dim": model.qk_rope_head_dim,
            "v_head_dim": model.v_head_dim,
        }
    if model.num_mtp_layers:
        sizes["mtp_num_layers"] = model.num_mtp_layers
    if model.is_moe:
        sizes |= {
            "num_moe_experts": model.num_experts,
            "moe_router_topk": model.experts_per_token,
            "moe_ffn_hidden_size": model.expert_ffn_hidden_size,
            "moe_token_dispatcher_type": "alltoall",  # as the cost model times it
            "moe_grouped_gemm": True,
            "moe_router_dtype": "fp32",  # as Bridge's MoE recipes; BF16 routing warns at >= 32
        }
        if model.shared_expert_ffn_hidden_size:
            sizes["moe_shared_expert_intermediate_size"] = model.shared_expert_ffn_hidden_size
        if ffn_pattern(model) is not None:
            sizes["moe_layer_freq"] = [int(k.endswith("/moe")) for k in model.layer_kinds]
        if model.moe_router_num_groups:
            sizes["moe_router_num_groups"] = model.moe_router_num_groups
            sizes["moe_router_group_topk"] = model.moe_router_group_topk
    return sizes


def _model_layout(lay: Layout, model: ModelSpec, stack: StackSpec) -> dict[str, Any]:
    if lay.pipeline_schedule not in MEGATRON_SCHEDULES:
        raise refuse_schedule("megatron-bridge", lay, "megatron")
    fields: dict[str, Any] = {
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
        "context_parallel_size": lay.cp,
        "sequence_parallel": lay.sequence_parallel,
    }
    if model.is_moe:
        if model.linear_bias and lay.etp > 1:
            raise refuse(
                "megatron-bridge",
                f"etp={lay.etp} with biased experts (transformer_config.py asserts ETP == 1)",
                "solve with --etp 1",
            )
        fields |= {"expert_model_parallel_size": lay.ep, "expert_tensor_parallel_size": lay.etp}
    # the planned split, never the recipe's own layout (its builder re-runs after a PP
    # override unless the layout itself is overridden: run_recipe.py sync_model_pipeline_layout);
    # a layout only where no other field gives the split (autopar.layout.split.pipeline_split)
    fields["pipeline_model_parallel_layout"] = None
    if lay.pp > 1:
        split = split_of(model.num_layers, lay.pp, lay.vpp, mtp_layers=model.num_mtp_layers)
        fields["pipeline_model_parallel_layout"] = split.layout
        fields |= {
            "account_for_embedding_in_pipeline_split": split.account_for_embedding,
            "account_for_loss_in_pipeline_split": split.account_for_loss,
        }
        if split.first_stage_layers is not None:
            fields |= {
                "num_layers_in_first_pipeline_stage": split.first_stage_layers,
                "num_layers_in_last_pipeline_stage": split.last_stage_layers,
            }
    if lay.recompute == "selective":
        modules = selective_modules(model, stack)
        if modules is None:
            fields["recompute_granularity"] = "selective"
        elif modules:
            fields |= {"recompute_granularity": "selective", "recompute_modules": modules}
    elif lay.recompute == "full":
        fields |= {
            "recompute_granularity": "full",
            "recompute_method": "uniform",
            "recompute_num_layers": 1,
        }
    return fields


def _sharding(lay: Layout, stack: StackSpec) -> dict[str, dict[str, Any]]:
    """ZeRO as megatron-core ``DistributedDataParallelConfig`` fields (ZeRO-2/3: Megatron-FSDP)
    and the stack's DP overlaps (``overlap_param_gather`` needs a sharded optimizer)."""
    ddp: dict[str, Any] = {
        "use_distributed_optimizer": lay.zero >= 1,
        "overlap_grad_reduce": stack.overlap_grad_reduce,
        "overlap_param_gather": stack.overlap_grad_reduce
        and stack.overlap_param_gather
        and lay.zero >= 1,
    }
    sections: dict[str, dict[str, Any]] = {
        "ddp": ddp,
        "optimizer": {"use_distributed_optimizer": lay.zero >= 1},
    }
    if lay.zero >= 2:
        ddp["use_megatron_fsdp"] = True
        ddp["data_parallel_sharding_strategy"] = (
            "optim_grads" if lay.zero == 2 else "optim_grads_params"
        )
        sections["checkpoint"] = {"ckpt_format": "fsdp_dtensor"}
    return sections


def _stack(lay: Layout, model: ModelSpec, stack: StackSpec) -> dict[str, dict[str, Any]]:
    """The stack's switches: ``CommOverlapConfig`` (training/comm_overlap.py) and the
    ``TransformerConfig`` fields behind Megatron's flags of the same names."""
    if stack.tp_comm_overlap and lay.tp > 1 and not lay.sequence_parallel:
        raise refuse(
            "megatron-bridge",
            "TP communication overlap without sequence parallelism",
            "solve with --sequence-parallel",
        )
    overlap: dict[str, Any] = {"tp_comm_overlap": stack.tp_comm_overlap and lay.tp > 1}
    if lay.vpp > 1:
        overlap["overlap_p2p_comm"] = stack.pp_comm_overlap
    if model.is_moe and lay.ep > 1:
        combined = lay.pipeline_schedule == "combined-1f1b"  # Megatron's combined 1F1B
        overlap["overlap_moe_expert_parallel_comm"] = combined
        overlap["delay_wgrad_compute"] = combined
    fields: dict[str, Any] = {
        "hidden_dropout": 0.1 if stack.dropout else 0.0,
        "attention_dropout": 0.1 if stack.dropout else 0.0,
        "cross_entropy_loss_fusion": stack.cross_entropy_fusion,
    }
    if stack.cross_entropy_fusion:  # the implementation the cost model priced
        fields["cross_entropy_fusion_impl"] = stack.cross_entropy_impl
    if lay.cp > 1:
        fields["cp_comm_type"] = stack.cp_comm_type
    if not stack.flash_attention:
        fields["attention_backend"] = "unfused"  # AttnBackend member name
    if stack.moe_fused_mlp and model.is_moe:  # the experts' fused grouped MLP (megatron-core
        # 0.19.2 transformer_config.py L511; Bridge's qwen3_moe gb200 recipe sets it)
        fields["use_transformer_engine_op_fuser"] = True
    return {"comm_overlap": overlap, "model": fields | _graphs_and_offload(lay, model, stack)}


def _graphs_and_offload(lay: Layout, model: ModelSpec, stack: StackSpec) -> dict[str, Any]:
    """CUDA graphs and CPU activation offloading as Megatron-Bridge's performance scripts set
    them (scripts/performance/utils/overrides.py L102-137 at v0.3.1): megatron-core 0.16 takes
    per-layer graphs as ``cuda_graph_impl=transformer_engine`` with a ``cuda_graph_scope`` list
    and whole-iteration graphs as ``cuda_graph_impl=local`` with scope ``full_iteration``
    (transformer_config.py L776-790); ``use_te_rng_tracker`` goes with any graph (the config
    container sets ``rng.te_rng_tracker`` to match, training/config.py L1429-1430)."""
    check_graphs_and_offload("megatron-bridge", lay, stack)
    fields: dict[str, Any] = {}
    if stack.cuda_graphs != "none" and stack.cpu_offload_layers:
        raise refuse(
            "megatron-bridge",
            "CUDA graphs with CPU offloading (megatron-core 0.16 transformer_config.py L1722: "
            "'CUDA graphs not supported with CPU offloading')",
            "use cuda_graphs none, or --format megatron (Megatron-LM main graphs the full "
            "iteration with offloading)",
        )
    if stack.cuda_graphs == "full":
        fields |= {"cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"]}
    elif stack.cuda_graphs == "layers":
        scope = ["attn", "moe_router", "moe_preprocess"] if model.is_moe else ["attn", "mlp"]
        fields |= {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": scope}
    if stack.cuda_graphs != "none":
        fields["use_te_rng_tracker"] = True
    if stack.cpu_offload_layers:
        fields |= {
            "cpu_offloading": True,
            "cpu_offloading_weights": False,
            "cpu_offloading_num_layers": stack.cpu_offload_layers,
        }
    return fields


def bridge_overrides(item: Estimate | Layout, problem: Problem) -> dict[str, dict[str, Any]]:
    """The overrides as ``{section: {field: value}}``."""
    lay = layout_of(item)
    model, training = problem.model, problem.training
    if training.grad_precision == "bf16":
        # the recipe's MixedPrecisionConfig overwrites ddp.grad_reduce_in_fp32 in setup()
        raise refuse(
            "megatron-bridge",
            "BF16 gradient reduction: the bf16_mixed recipe sets grad_reduce_in_fp32=True "
            "(training/mixed_precision.py); set it in your recipe",
            "use --format megatron",
        )
    sections: dict[str, dict[str, Any]] = {
        "model": _model_sizes(model, training.seq_len) | _model_layout(lay, model, training.stack),
        "train": {
            "micro_batch_size": lay.mbs,
            "global_batch_size": training.global_batch_sequences,
        },
        "dataset": {"seq_length": training.seq_len},  # model.seq_length follows it
    }
    sections["model"] |= model_details(model)
    if model.is_moe:
        dispatcher = dispatcher_of(item)
        sections["model"]["moe_token_dispatcher_type"] = dispatcher
        if dispatcher == "flex":
            sections["model"]["moe_flex_dispatcher_backend"] = "deepep"
        if dispatcher == "allgather" and model.shared_expert_ffn_hidden_size:
            sections["model"]["moe_shared_expert_overlap"] = False
    sections |= _sharding(lay, training.stack)
    stack = _stack(lay, model, training.stack)
    sections["model"] |= stack["model"]
    if any(stack["comm_overlap"].values()):
        # built anew whether the recipe has the section or not (_target_: omegaconf_utils
        # _apply_overrides instantiates it); the recipe's userbuffers tuning, a nested config
        # that does not survive re-instantiation, gives way to Transformer Engine's defaults
        sections["comm_overlap"] = {
            "_target_": COMM_OVERLAP_CLASS,
            **stack["comm_overlap"],
            "tp_comm_overlap_cfg": None,
        }
    else:  # no communication overlap planned: none, whatever the recipe set
        sections["comm_overlap"] = {"": None}
    sections["mixed_precision"] = {"": _mixed_precision(training)}
    checkpoint = _checkpoint(item, training.stack)
    if checkpoint:
        sections["checkpoint"] = sections.get("checkpoint", {}) | checkpoint
    return sections


def _checkpoint(item: Estimate | Layout, stack: StackSpec) -> dict[str, Any]:
    """``CheckpointConfig``: the goodput-optimal ``save_interval``, the asynchronous save (with
    the persistent worker Megatron needs) and the first-replica save, when the stack asks."""
    out: dict[str, Any] = {}
    interval = checkpoint_interval_of(item)
    if interval is not None:
        out["save_interval"] = interval
    if stack.async_checkpoint:
        out |= {"async_save": True, "use_persistent_ckpt_worker": True}
    if not stack.ckpt_fully_parallel_save:
        out["fully_parallel_save"] = False
    return out


_FP8_RECIPES = {
    "delayed": "bf16_with_fp8_delayed_scaling_mixed",
    "current": "bf16_with_fp8_current_scaling_mixed",
    "blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
}
"""autopar FP8 recipe -> Megatron-Bridge mixed-precision recipe (training/mixed_precision.py
L212-390 at v0.3.1)."""
NVFP4_RECIPE = "bf16_with_nvfp4_mixed"
"""training/mixed_precision.py L392-403 at v0.3.1: fp4 e2m1, fp4_recipe nvfp4, no FP8."""


def _mixed_precision(training: TrainingSpec) -> str:
    if training.precision not in ("fp8", "nvfp4"):
        return "bf16_mixed"
    if set(training.stack.fp8_gemms) != set(DEFAULT_FP8_GEMMS):
        fmt = "FP4" if training.precision == "nvfp4" else "FP8"
        raise refuse(
            "megatron-bridge",
            f"{fmt} on the GEMMs {', '.join(training.stack.fp8_gemms)} (recipes cover the linear "
            "layers)",
            "use fp8_gemms qkv,proj,fc1,fc2",
        )
    if training.precision == "nvfp4":
        return NVFP4_RECIPE
    return _FP8_RECIPES[training.stack.fp8_recipe]


def bridge_args(item: Estimate | Layout, problem: Problem) -> list[str]:
    """The overrides as ``section.key=value`` strings (``parse_hydra_overrides``), ``++`` before
    the keys of ``OPTIONAL_SECTIONS``."""
    out = []
    for section, fields in bridge_overrides(item, problem).items():
        for key, value in fields.items():
            name = f"{section}.{key}" if key else section
            prefix = "++" if section in OPTIONAL_SECTIONS and key else ""
            out.append(f"{prefix}{name}={_value(value)}")
    return out


def bridge_text(item: Estimate | Layout, problem: Problem) -> str:
    """A header naming the target, then one override per line."""
    header = (
        f"# autopar: {BRIDGE_TARGET} recipe overrides for {problem.model.name}, stack "
        f"{problem.training.stack.name}; start from the recipe of this model family"
    )
    return "\n".join([header, *bridge_args(item, problem)])
