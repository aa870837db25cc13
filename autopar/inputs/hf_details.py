"""The keys of a Hugging Face config that change the computation without changing the layer
shapes: RoPE base and scaling, the activation and gating, norms, biases, q/k norms, router
scoring, sliding windows, Gemma's soft-capping and extra norms (``autopar.inputs.hf_keys`` says
which family reads which).

``check_keys`` refuses a key the file's ``model_type`` does not read or list as harmless;
``detail_fields`` turns the read ones into ``ModelSpec`` fields. Out-of-range values (a negative
RoPE base, a soft-cap <= 0) are refused naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autopar.base.errors import InputError, excerpt
from autopar.inputs import hf_families, hf_keys
from autopar.inputs.specs import RopeSpec

ACTIVATION_NAMES: dict[str, str] = {
    # HF ACT2FN name (transformers activations.py) -> autopar activation
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "relu2": "relu2",
}
GATED_KINDS = {"silu": "swiglu", "gelu_tanh": "geglu"}
UNGATED_KINDS = {"gelu": "gelu", "gelu_tanh": "gelu", "relu": "gelu", "relu2": "squared_relu"}
ROPE_KEYS: dict[str, tuple[str, ...]] = {
    # rope type -> the keys of rope_scaling it reads (transformers modeling_rope_utils.py)
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
    "linear": ("factor",),
}
MAX_FLOAT = 1e12


def _number(data: Mapping[str, Any], key: str, default: float, *, zero_ok: bool = False) -> float:
    value = data.get(key)
    if value is None:
        return default
    bad = isinstance(value, bool) or not isinstance(value, int | float)
    low_ok = not bad and (value >= 0 if zero_ok else value > 0)
    if bad or not math.isfinite(value) or not (low_ok and value <= MAX_FLOAT):
        rule = "a number >= 0" if zero_ok else "a positive number"
        raise InputError(f"must be {rule}, got {excerpt(value)}", field=key)
    return float(value)


# ---------------------------------------------------------------------------------------------
# keys


def check_keys(data: Mapping[str, Any], extra: tuple[str, ...]) -> None:
    """Every key of ``data`` is read or harmless for its ``model_type`` (or one of ``extra``,
    autopar's own keys); else the key is refused, with what it changes when the table knows."""
    model_type = data.get("model_type")
    if not isinstance(model_type, str):
        raise InputError(f"must be a string, got {excerpt(model_type)}", field="model_type")
    if model_type not in hf_keys.FAMILIES:
        raise InputError(
            f"{excerpt(model_type)} is not a model_type autopar reads; supported: "
            f"{hf_keys.SUPPORTED}",
            field="model_type",
        )
    for key in data:
        if key in extra:
            continue
        status, reason = hf_keys.key_status(str(model_type), key)
        if status == "refused" and data[key] not in (None, False, 0, 0.0):
            raise InputError(
                f"changes the computation ({reason}), which autopar does not model for "
                f"model_type {model_type}",
                field=key,
            )
        if status == "unknown":
            family_error = hf_families.unmodelled_key_error(key)
            if family_error is not None:  # another family's key: say which, suggest nothing
                raise family_error
            raise InputError(
                f"is not a key autopar has reviewed for model_type {model_type} "
                "(autopar/inputs/hf_keys.py); refused rather than ignored",
                field=key[:100],
            )


# ---------------------------------------------------------------------------------------------
# values


def activation_of(data: Mapping[str, Any], family: str) -> tuple[str, str]:
    """(mlp_kind, activation) from the activation key the family uses."""
    key = next(
        (k for k in ("hidden_activation", "hidden_act", "activation_function") if data.get(k)),
        "hidden_act",
    )
    name = data.get(key, "silu")
    if not isinstance(name, str) or name not in ACTIVATION_NAMES:
        raise InputError(
            f"{excerpt(name)} is not an activation autopar models ({', '.join(ACTIVATION_NAMES)})",
            field=key,
        )
    activation = ACTIVATION_NAMES[name]
    if hf_keys.FAMILIES[family].gated_mlp:
        if activation not in GATED_KINDS:
            raise InputError(
                f"a gated MLP with {name} is not modelled (silu or gelu_pytorch_tanh)", field=key
            )
        return GATED_KINDS[activation], activation
    if activation not in UNGATED_KINDS:
        raise InputError(f"an ungated MLP with {name} is not modelled", field=key)
    return UNGATED_KINDS[activation], activation


def _written_mlp_kind(data: Mapping[str, Any], family: str) -> dict[str, str]:
    """``activation`` from the activation key when an autopar ``mlp_kind`` is written beside it
    (the presets): it must agree with the key's, and then only names it."""
    mlp_kind, activation = activation_of(data, family)
    if data["mlp_kind"] != mlp_kind:
        raise InputError(
            f"{excerpt(data['mlp_kind'])} contradicts the activation key, which gives "
            f"{mlp_kind} for model_type {family}",
            field="mlp_kind",
        )
    return {"activation": activation}


def rope_spec(data: Mapping[str, Any]) -> RopeSpec:
    """``rope_theta`` and ``rope_scaling`` (or transformers 5's ``rope_parameters``, which holds
    both) as a ``RopeSpec``; a scaling type autopar does not model is refused by name."""
    params = data.get("rope_parameters")
    scaling = data.get("rope_scaling")
    if isinstance(params, Mapping):
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        theta = _number(params, "rope_theta", 10000.0)
    else:
        theta = _number(data, "rope_theta", 10000.0)
    fields: dict[str, Any] = {
        "theta": theta,
        "percent": _number(data, "partial_rotary_factor", 1.0),
        "local_theta": _number(data, "rope_local_base_freq", 0.0, zero_ok=True),
    }
    if fields["percent"] > 1:
        raise InputError("must be at most 1", field="partial_rotary_factor")
    if scaling is None or scaling == {}:
        return RopeSpec(**fields)
    if not isinstance(scaling, Mapping):
        raise InputError(f"must be a mapping or null, got {excerpt(scaling)}", field="rope_scaling")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return RopeSpec(**fields)
    if kind not in ROPE_KEYS:
        raise InputError(
            f"type {excerpt(kind)} is not modelled (autopar reads {', '.join(ROPE_KEYS)})",
            field="rope_scaling",
        )
    for key in scaling:
        if key not in (*ROPE_KEYS[kind], "type", "rope_type"):
            raise InputError(
                f"{kind} key {excerpt(key)} is not modelled; refused rather than ignored",
                field="rope_scaling",
            )
    defaults = RopeSpec()
    for key in ROPE_KEYS[kind]:
        if key == "truncate":
            fields[key] = hf_families.flag(scaling, key, True)
        elif key == "original_max_position_embeddings":
            fields[key] = int(_number(scaling, key, 0.0, zero_ok=True))
        else:
            zero_ok = key == "mscale_all_dim"
            fields[key] = _number(scaling, key, getattr(defaults, key), zero_ok=zero_ok)
    return RopeSpec(scaling=kind, **fields)


def _window_layers(data: Mapping[str, Any], family: str, layers: int) -> tuple[int, list[bool]]:
    """(window, which layers slide) as each family's modeling code decides it."""
    window_key = "sliding_window" if data.get("sliding_window") else "sliding_window_size"
    if family.startswith("qwen") and not hf_families.flag(data, "use_sliding_window", False):
        return 0, [False] * layers
    window = int(_number(data, window_key, 0.0, zero_ok=True))
    if not window:
        return 0, [False] * layers
    types = data.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        bad = [t for t in types if t not in ("sliding_attention", "full_attention")]
        if bad:
            raise InputError(f"{excerpt(bad[0])} is not sliding_attention", field="layer_types")
        return window, [t == "sliding_attention" for t in types]
    if types is not None:
        raise InputError(f"must list one type per layer ({layers})", field="layer_types")
    if family == "gemma2":  # modeling_gemma2.py: is_sliding = not bool(layer_idx % 2)
        return window, [i % 2 == 0 for i in range(layers)]
    if family == "gemma3_text":  # every sliding_window_pattern-th layer attends globally
        pattern = int(_number(data, "sliding_window_pattern", 6.0))
        return window, [(i + 1) % pattern != 0 for i in range(layers)]
    if family.startswith("qwen"):  # sliding from max_window_layers on
        first = int(_number(data, "max_window_layers", 0.0, zero_ok=True))
        return window, [i >= first for i in range(layers)]
    return window, [True] * layers  # mistral, mixtral, phi3: every layer


def _layer_types(data: Mapping[str, Any], family: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """``layer_types`` when layers slide or an MoE model keeps some MLPs dense
    (``mlp_only_layers``); else nothing (every layer attends fully, MoE every step)."""
    layers = fields["num_layers"]
    window, sliding = _window_layers(data, family, layers)
    dense = data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or any(
        not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < layers for i in dense
    ):
        raise InputError(f"must list layer indices below {layers}", field="mlp_only_layers")
    if not window and not dense:
        return {}
    step, experts = fields["moe_layer_freq"], fields["num_experts"]
    kinds = tuple(
        ("sliding" if sliding[i] else "attention")
        + ("/moe" if experts and (i + 1) % step == 0 and i not in set(dense) else "/dense")
        for i in range(layers)
    )
    return {"layer_types": kinds, "attention_window": window if any(sliding) else 0}


def _router(data: Mapping[str, Any], family: str) -> dict[str, Any]:
    """Router scoring (DeepSeek ``scoring_func`` / ``topk_method`` / ``routed_scaling_factor``),
    top-k renormalisation (``norm_topk_prob``: Mixtral always renormalises, Qwen-MoE's default
    is false) and Qwen-MoE's shared-expert gate."""
    out: dict[str, Any] = {}
    score = data.get("scoring_func", "softmax")
    if score not in ("softmax", "sigmoid"):
        raise InputError(f"{excerpt(score)} is not softmax or sigmoid", field="scoring_func")
    out["moe_router_score_function"] = score
    method = data.get("topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise InputError(
            f"{excerpt(method)} is not greedy, group_limited_greedy or noaux_tc",
            field="topk_method",
        )
    out["moe_router_expert_bias"] = method == "noaux_tc"
    out["moe_router_topk_scaling_factor"] = _number(data, "routed_scaling_factor", 1.0)
    if family == "llama4_text":  # modeling_llama4.py: sigmoid of the top-k logits
        out["moe_router_score_function"] = "sigmoid"
    always = hf_keys.FAMILIES[family].renormalised_topk
    out["moe_router_pre_softmax"] = not (always or hf_families.flag(data, "norm_topk_prob", False))
    if hf_families.flag(data, "seq_aux", False):
        out["moe_router_load_balancing"] = "seq_aux_loss"
    return out


def detail_fields(data: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """``ModelSpec`` fields read from ``data`` (a config of a family in ``hf_keys.FAMILIES``),
    on top of the shared ``fields``; the family's implied fields fill what ``data`` leaves
    to the modeling code unless an autopar key set it (``explicit``)."""
    family = str(data["model_type"])
    out: dict[str, Any] = {"rope": rope_spec(data)}
    if "mlp_kind" in data and family != "nemotron_h":  # nemotron_h: mlp_hidden_act
        out |= _written_mlp_kind(data, family)  # without one, hf_config read the key already
    eps_key = next(
        (k for k in ("rms_norm_eps", "layer_norm_epsilon", "norm_eps") if k in data), None
    )
    if eps_key is not None:
        out["norm_epsilon"] = _number(data, eps_key, 1e-5)
    if hf_keys.FAMILIES[family].refuses_attention_bias and hf_families.flag(
        data, "attention_bias", False
    ):
        raise InputError(
            "true (biases on q, k, v and the output projection) is not modelled",
            field="attention_bias",
        )
    if family == "llama" and hf_families.flag(data, "mlp_bias", False):
        raise InputError("true (biases on the MLP) is not modelled", field="mlp_bias")
    if family == "llama4_text":
        out["qk_l2_norm"] = hf_families.flag(data, "use_qk_norm", False)
    if fields["num_experts"] or data.get("n_routed_experts"):
        out |= _router(data, family)
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
        if data.get(key) is not None:
            out[key] = _number(data, key, 0.0)
    if family == "gpt2" and not hf_families.flag(data, "scale_attn_weights", True):
        raise InputError(
            "false (unscaled attention scores) is not modelled", field="scale_attn_weights"
        )
    if family not in ("deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss", "llama4_text"):
        out |= _layer_types(data, family, {**fields, **out})
    implied = hf_keys.FAMILIES[family].implied
    explicit = {
        "learned_position_embeddings": "position_embedding_type",
        "layernorm": "normalization",
        "linear_bias": "add_bias_linear",
        "tied_embeddings": "tie_word_embeddings",
    }
    for name, value in implied.items():
        if explicit.get(name) not in data:
            out[name] = value
    if family == "qwen2_moe":
        out["shared_expert_gate"] = bool(fields["shared_expert_ffn_hidden_size"])
    return out
