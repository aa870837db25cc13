"""Hugging Face model families whose ``config.json`` keys change the layer structure.

``autopar.inputs.hf_config`` reads the keys every decoder shares (``MODEL_KEYS``); this module reads
the keys of the families below, as the Hub publishes them, and turns them into ``ModelSpec`` fields:
``layer_types`` (one ``"mixer/ffn"`` per layer), multi-latent attention, multi-token prediction,
sliding / chunked attention, Mamba-2 mixers, node-limited routing.

- ``deepseek_v2`` / ``deepseek_v3`` / ``kimi_k2`` (DeepSeek-V2/V3/R1; Kimi-K2's config names its
  own model_type but loads DeepSeek-V3's ``configuration_deepseek.py``): transformers
  ``configuration_deepseek_v3.py``; layer ``i`` is MoE when ``i >= first_k_dense_replace`` and
  ``i % moe_layer_freq == 0``; ``n_shared_experts`` experts of ``moe_intermediate_size`` are
  always active.
- ``gpt_oss``: transformers ``configuration_gpt_oss.py``; ``layer_types`` of
  ``sliding_attention`` / ``full_attention`` (default: even layers slide), a learned sink per
  head, biases on attention, router and experts; every layer is MoE.
- ``llama4_text`` / ``llama4`` (the latter nests ``text_config``): ``configuration_llama4.py``;
  layers ``step-1, 2*step-1, ...`` are MoE (``interleave_moe_layer_step``) with experts of
  ``intermediate_size`` and one shared expert of the same size, the others dense of
  ``intermediate_size_mlp``; RoPE layers (``no_rope_layers[i] == 1``, default all but every
  fourth) use chunked attention over ``attention_chunk_size`` keys.
- ``nemotron_h`` (Nemotron-H, Nemotron-3 Nano): ``hybrid_override_pattern``, one character per
  layer: ``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE (Megatron
  ``megatron/core/ssm/mamba_hybrid_layer_allocation.py``).

A key that changes the architecture is either modelled here or refused with the family and the
key; inconsistent values are refused with the key as written and the rule. Nothing here suggests
renaming a key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from autopar.base.errors import InputError, excerpt
from autopar.inputs.hf_keys import MLA_KEYS

MAX_FAMILY_INT = 1 << 24
"""Largest value of a family key (ranks, expert counts, windows): checked before arithmetic."""
ARCHITECTURE_KEYS: dict[str, str] = {
    # key -> the family that gives it a meaning autopar models
    **{key: "deepseek_v3" for key in (*MLA_KEYS, "n_routed_experts", "first_k_dense_replace")},
    "num_nextn_predict_layers": "deepseek_v3",
    "interleave_moe_layer_step": "llama4_text",
    "intermediate_size_mlp": "llama4_text",
    "attention_chunk_size": "llama4_text",
    "hybrid_override_pattern": "nemotron_h",
    "mamba_num_heads": "nemotron_h",
    "ssm_state_size": "nemotron_h",
}
NEMOTRON_H_SYMBOLS = {"M": "mamba/none", "*": "attention/none", "-": "none/dense", "E": "none/moe"}


# ---------------------------------------------------------------------------------------------
# reading values


def _int(data: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = data.get(key)
    if value is None:
        if default is None:
            raise InputError("required key is missing", field=key)
        return default
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FAMILY_INT:
        raise InputError(
            f"must be a non-negative integer <= {MAX_FAMILY_INT:,}, got {excerpt(value)}",
            field=key,
        )
    return value


def flag(data: Mapping[str, Any], key: str, default: bool) -> bool:
    """``data[key]`` as a boolean (``default`` when absent or null), else an error naming it."""
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(f"must be true or false, got {excerpt(value)}", field=key)
    return value


def _refuse(data: Mapping[str, Any], family: str, key: str, rule: str) -> None:
    raise InputError(f"{rule} (model_type {family})", field=key)


# ---------------------------------------------------------------------------------------------
# the hook hf_config.py calls


def unwrap(data: Mapping[str, Any]) -> dict[str, Any]:
    """A multimodal ``llama4`` config's ``text_config`` as a ``llama4_text`` config (the vision
    tower is not modelled: autopar plans the language model)."""
    if data.get("model_type") != "llama4":
        return dict(data)
    text = data.get("text_config")
    if not isinstance(text, Mapping):
        raise InputError(
            "must hold the language model's keys (model_type llama4)", field="text_config"
        )
    keep = {
        k: data[k]
        for k in ("name", "_name_or_path", "aliases", "source", "architectures")
        if k in data
    }
    return {**text, **keep, "model_type": "llama4_text"}


def unmodelled_key_error(key: str) -> InputError | None:
    """For a key that only a family gives a meaning to: the error that says so."""
    family = ARCHITECTURE_KEYS.get(key)
    if family is None:
        return None
    return InputError(
        f"changes the architecture; autopar models it for model_type {family} only, and this "
        "file's model_type is not that family",
        field=key,
    )


def family_fields(data: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """``ModelSpec`` fields for ``data``'s family, on top of the shared ``fields``."""
    model_type = str(data.get("model_type"))
    build = BUILDERS.get(model_type)
    # another family's architecture keys were refused by the key checks before this
    # (hf_details.check_keys; hf_config._check_model_keys without a model_type)
    return dict(fields) if build is None else {**fields, **build(data, fields)}


# ---------------------------------------------------------------------------------------------
# families


def _deepseek(data: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    family, layers = str(data["model_type"]), fields["num_layers"]
    if data.get("kv_lora_rank") is None:
        _refuse(data, family, "kv_lora_rank", "required: this family uses multi-latent attention")
    for key in MLA_KEYS[1:]:
        if data.get(key) is None:
            _refuse(data, family, key, "required with kv_lora_rank (multi-latent attention)")
    if flag(data, "attention_bias", False):
        _refuse(data, family, "attention_bias", "true is not modelled")
    experts = _int(data, "n_routed_experts", 0)
    top_k = _int(data, "num_experts_per_tok", 0)
    if experts and not 1 <= top_k <= experts:
        _refuse(data, family, "num_experts_per_tok", f"must be in 1..n_routed_experts ({experts})")
    first_dense = _int(data, "first_k_dense_replace", 0)
    if first_dense > layers:
        _refuse(
            data,
            family,
            "first_k_dense_replace",
            f"must not exceed num_hidden_layers ({layers})",
        )
    freq = _int(data, "moe_layer_freq", 1)
    if freq < 1:
        _refuse(data, family, "moe_layer_freq", "must be at least 1")
    groups, group_topk = _int(data, "n_group", 0), _int(data, "topk_group", 0)
    if groups and experts % groups:
        _refuse(data, family, "n_group", f"must divide n_routed_experts ({experts})")
    if group_topk > groups:
        _refuse(data, family, "topk_group", f"must not exceed n_group ({groups})")
    expert_ffn = _int(data, "moe_intermediate_size", 0) if experts else 0
    kinds = tuple(
        "mla/moe" if experts and i >= first_dense and i % freq == 0 else "mla/dense"
        for i in range(layers)
    )
    return {
        "head_dim": 0,
        "num_kv_heads": fields["num_attention_heads"],
        "q_lora_rank": _int(data, "q_lora_rank", 0),
        "kv_lora_rank": _int(data, "kv_lora_rank"),
        "qk_nope_head_dim": _int(data, "qk_nope_head_dim"),
        "qk_rope_head_dim": _int(data, "qk_rope_head_dim"),
        "v_head_dim": _int(data, "v_head_dim"),
        "num_experts": experts,
        "experts_per_token": top_k if experts else 0,
        "moe_ffn_hidden_size": expert_ffn,
        "shared_expert_ffn_hidden_size": _int(data, "n_shared_experts", 0) * expert_ffn,
        "moe_router_num_groups": groups,
        "moe_router_group_topk": group_topk,
        "num_mtp_layers": _int(data, "num_nextn_predict_layers", 0),
        "layer_types": kinds,
        "moe_layer_freq": 1,
    }


def _gpt_oss(data: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    family, layers = "gpt_oss", fields["num_layers"]
    top_k = _int(data, "num_experts_per_tok", _int(data, "experts_per_token", 0))
    if "experts_per_token" in data and _int(data, "experts_per_token") != top_k:
        _refuse(data, family, "experts_per_token", "must equal num_experts_per_tok")
    experts = fields["num_experts"]
    if not experts:
        _refuse(data, family, "num_local_experts", "required: every layer is MoE")
    if not 1 <= top_k <= experts:
        _refuse(data, family, "num_experts_per_tok", f"must be in 1..num_local_experts ({experts})")
    types = data.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        _refuse(data, family, "layer_types", f"must list one type per layer ({layers})")
    mixers = {"sliding_attention": "sliding", "full_attention": "attention"}
    for value in types:
        if not isinstance(value, str) or value not in mixers:
            _refuse(
                data,
                family,
                "layer_types",
                f"{excerpt(value)} is not sliding_attention or full_attention",
            )
    window = _int(data, "sliding_window", 0)
    if "sliding_attention" in types and not window:
        _refuse(data, family, "sliding_window", "required by sliding_attention layers")
    return {
        "experts_per_token": top_k,
        "moe_ffn_hidden_size": fields["ffn_hidden_size"],
        "attention_window": window,
        "attention_sinks": True,
        "clamped_glu": True,
        "linear_bias": flag(data, "attention_bias", True),
        "mlp_kind": "swiglu",
        "layer_types": tuple(f"{mixers[t]}/moe" for t in types),
    }


def _llama4(data: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    family, layers = "llama4_text", fields["num_layers"]
    experts, top_k = fields["num_experts"], fields["experts_per_token"]
    step = _int(data, "interleave_moe_layer_step", 1)
    if step < 1:
        _refuse(data, family, "interleave_moe_layer_step", "must be at least 1")
    moe_layers = data.get("moe_layers")
    if moe_layers is None:
        moe_layers = list(range(step - 1, layers, step))
    if not isinstance(moe_layers, list) or any(
        not isinstance(i, int) or not 0 <= i < layers for i in moe_layers
    ):
        _refuse(data, family, "moe_layers", f"must list layer indices below {layers}")
    moe_layers = set(moe_layers)  # membership per layer below: O(1), not O(layers)
    no_rope = data.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
    if not isinstance(no_rope, list) or len(no_rope) != layers:
        _refuse(data, family, "no_rope_layers", f"must hold one 0/1 per layer ({layers})")
    chunk = _int(data, "attention_chunk_size", 0)
    if flag(data, "attention_bias", False):
        _refuse(data, family, "attention_bias", "true is not modelled")
    expert_ffn = fields["ffn_hidden_size"]
    dense_ffn = _int(data, "intermediate_size_mlp", expert_ffn)
    kinds = tuple(
        ("sliding" if chunk and no_rope[i] else "attention")
        + ("/moe" if experts and i in moe_layers else "/dense")
        for i in range(layers)
    )
    return {
        "ffn_hidden_size": dense_ffn,
        "moe_ffn_hidden_size": expert_ffn if experts else 0,
        "shared_expert_ffn_hidden_size": expert_ffn if experts else 0,
        "experts_per_token": top_k if experts else 0,
        "attention_window": chunk if any("sliding" in k for k in kinds) else 0,
        "layer_types": kinds,
        "moe_layer_freq": 1,
    }


def _nemotron_h(data: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    family, layers = "nemotron_h", fields["num_layers"]
    pattern = data.get("hybrid_override_pattern")
    if not isinstance(pattern, str):
        _refuse(data, family, "hybrid_override_pattern", "required: one character per layer")
    if len(pattern) != layers:
        _refuse(
            data,
            family,
            "hybrid_override_pattern",
            f"has {len(pattern)} characters for num_hidden_layers {layers}",
        )
    bad = sorted(set(pattern) - set(NEMOTRON_H_SYMBOLS))
    if bad:
        _refuse(
            data, family, "hybrid_override_pattern", f"unknown layer symbol(s) {bad}; use M * - E"
        )
    for key in ("num_nextn_predict_layers", "moe_latent_size"):
        if data.get(key):
            _refuse(data, family, key, "is not modelled for this family")
    experts = _int(data, "n_routed_experts", 0)
    if "E" in pattern and not experts:
        _refuse(data, family, "n_routed_experts", "required by the pattern's E (MoE) layers")
    top_k = _int(data, "num_experts_per_tok", 0)
    if experts and not 1 <= top_k <= experts:
        _refuse(data, family, "num_experts_per_tok", f"must be in 1..n_routed_experts ({experts})")
    act = data.get("mlp_hidden_act", "relu2")
    kinds = {"relu2": "squared_relu", "silu": "swiglu", "gelu": "gelu"}
    if not isinstance(act, str) or act not in kinds:
        _refuse(data, family, "mlp_hidden_act", f"{excerpt(act)} is not relu2, silu or gelu")
    heads = fields["num_attention_heads"]
    head_dim = _int(data, "attention_head_dim", fields["head_dim"])
    if "M" in pattern:
        for key in ("mamba_num_heads", "mamba_head_dim", "ssm_state_size"):
            _int(data, key)
    return {
        "head_dim": head_dim if head_dim * heads != fields["hidden_size"] else 0,
        "mlp_kind": kinds[act],
        "linear_bias": flag(data, "use_bias", False) or flag(data, "mlp_bias", False),
        "num_experts": experts,
        "experts_per_token": top_k if experts else 0,
        "moe_ffn_hidden_size": _int(data, "moe_intermediate_size", 0) if experts else 0,
        "shared_expert_ffn_hidden_size": _int(data, "moe_shared_expert_intermediate_size", 0)
        * min(_int(data, "n_shared_experts", 1), 1),
        "moe_router_num_groups": _int(data, "n_group", 0),
        "moe_router_group_topk": _int(data, "topk_group", 0),
        "mamba_num_heads": _int(data, "mamba_num_heads", 0),
        "mamba_head_dim": _int(data, "mamba_head_dim", 0),
        "mamba_state_size": _int(data, "ssm_state_size", 0),
        "mamba_num_groups": _int(data, "n_groups", 1),
        "mamba_conv_kernel": _int(data, "conv_kernel", 4),
        "mamba_chunk_size": _int(data, "chunk_size", 128),
        "layer_types": tuple(NEMOTRON_H_SYMBOLS[c] for c in pattern),
        "moe_layer_freq": 1,
    }


BUILDERS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, Any]]] = {
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "gpt_oss": _gpt_oss,
    "llama4_text": _llama4,
    "nemotron_h": _nemotron_h,
}
