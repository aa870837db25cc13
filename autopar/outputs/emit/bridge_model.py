"""The model details a Megatron-Bridge override set carries beyond the layer shapes: RoPE base and
scaling, norm epsilon, biases, q/k norms, the activation, router scoring (Megatron-Bridge 0.6.2,
``models/gpt_provider.py`` ``GPTModelProvider`` = megatron-core 0.19 ``TransformerConfig`` plus
``rotary_base``, ``rope_scaling``, ``yarn_*``; MLA providers use ``MLATransformerConfig``'s
``rotary_scaling_factor``, ``mscale``, ``beta_fast`` ...).

The recipe's own Hugging Face conversion sets these from the model's ``config.json``; autopar
writes them anyway, so the overrides state the model it planned, whichever recipe they are
applied to (a sibling model's recipe keeps its RoPE base otherwise).
"""

from __future__ import annotations

from typing import Any

from autopar.inputs.specs import ModelSpec
from autopar.outputs.emit.common import refuse, refuse_unbuildable_rope

ACTIVATION_FUNCS: dict[str, str] = {
    # autopar activation -> the name Bridge's override resolves to a callable
    # (utils/activation_map.py ACTIVATION_FUNC_MAP; model.activation_func is serialisable,
    # training/utils/omegaconf_utils.py _SERIALIZABLE_CALLABLE_FIELDS)
    "silu": "silu",
    "gelu": "gelu",
    "gelu_tanh": "fast_gelu",
    "relu": "relu",
    "relu2": "squared_relu",
}


def _rope(model: ModelSpec) -> dict[str, Any]:
    rope = model.rope
    fields: dict[str, Any] = {"rotary_base": rope.theta, "rotary_percent": rope.percent}
    refuse_unbuildable_rope("megatron-bridge", model, "start from its recipe")
    if rope.scaling == "llama3":
        fields |= {"rope_scaling": True, "rope_scaling_factor": rope.factor}
    elif rope.scaling == "linear":
        fields["seq_len_interpolation_factor"] = rope.factor
    elif rope.scaling == "yarn" and model.is_mla:  # MLATransformerConfig's own YaRN fields
        fields |= {
            "rotary_scaling_factor": rope.factor,
            "mscale": rope.mscale,
            "mscale_all_dim": rope.mscale_all_dim,
            "beta_fast": rope.beta_fast,
            "beta_slow": rope.beta_slow,
            "original_max_position_embeddings": rope.original_max_position_embeddings,
        }
    elif rope.scaling == "yarn":
        fields |= {
            "position_embedding_type": "yarn",
            "yarn_rotary_scaling_factor": rope.factor,
            "yarn_original_max_position_embeddings": rope.original_max_position_embeddings,
            "yarn_beta_fast": rope.beta_fast,
            "yarn_beta_slow": rope.beta_slow,
            "yarn_mscale": rope.mscale,
            "yarn_mscale_all_dim": rope.mscale_all_dim,
            "yarn_correction_range_round_to_int": rope.truncate,
        }
    return fields


def _router(model: ModelSpec) -> dict[str, Any]:
    """Router scoring as the model was trained (the same fields as Megatron-LM's router flags)."""
    fields: dict[str, Any] = {
        "moe_router_score_function": model.moe_router_score_function,
        "moe_router_enable_expert_bias": model.moe_router_expert_bias,
        "moe_router_pre_softmax": model.moe_router_pre_softmax and model.experts_per_token > 1,
        "moe_router_load_balancing_type": model.moe_router_load_balancing,
    }
    if model.moe_router_topk_scaling_factor != 1:
        fields["moe_router_topk_scaling_factor"] = model.moe_router_topk_scaling_factor
    if model.shared_expert_gate:
        fields["moe_shared_expert_gate"] = True
    return fields


def model_details(model: ModelSpec) -> dict[str, Any]:
    """``model.*`` fields beyond the shapes (module docstring)."""
    features = [
        (model.attn_logit_softcapping, "attention logit soft-capping"),
        (model.final_logit_softcapping, "final logit soft-capping"),
        (model.query_pre_attn_scalar, "query_pre_attn_scalar"),
        (model.gemma_norms, "Gemma's extra norms"),
        (model.qk_l2_norm, "q/k L2 norm"),
    ]
    missing = [name for value, name in features if value]
    if missing:
        raise refuse(
            "megatron-bridge",
            f"{model.name}'s {', '.join(missing)} as overrides",
            "start from its Megatron-Bridge recipe unchanged",
        )
    fields: dict[str, Any] = {
        "activation_func": ACTIVATION_FUNCS[model.activation_function],
        "gated_linear_unit": model.gated_mlp,
        "layernorm_epsilon": model.norm_epsilon,
        "add_qkv_bias": model.qkv_bias,
        "qk_layernorm": model.qk_layernorm,
        "layernorm_zero_centered_gamma": model.norm_zero_centered,
    }
    if not model.learned_position_embeddings:
        fields |= _rope(model)
    if model.is_moe:
        fields |= _router(model)
    return fields
