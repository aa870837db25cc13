"""A Hugging Face ``config.json`` (or a model preset in its terms) -> ``ModelSpec``.

Model files use Hugging Face key names (DESIGN §1), so a downloaded config loads unchanged;
autopar-only keys (``mlp_kind``, ``position_embedding_type``, ``normalization``,
``add_bias_linear``, ``name``, ``aliases``) fill what HF leaves implicit. A file with a
``model_type`` is checked key by key against ``autopar.inputs.hf_keys`` (``hf_details``); the
shapes are read here, the per-family details in ``hf_details`` and ``hf_families``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from autopar.base.errors import InputError, excerpt
from autopar.inputs import hf_details, hf_families, hf_keys
from autopar.inputs.fields import boolean, choice, integer, unknown_key
from autopar.inputs.names import model_name
from autopar.inputs.names import string_value as string
from autopar.inputs.specs import ModelSpec

MODEL_KEYS: dict[str, str] = {
    # HF key -> ModelSpec field
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_kv_heads",
    "intermediate_size": "ffn_hidden_size",
    "vocab_size": "vocab_size",
    "head_dim": "head_dim",
    "tie_word_embeddings": "tied_embeddings",
    "max_position_embeddings": "max_position_embeddings",
    "num_local_experts": "num_experts",
    "num_experts": "num_experts",
    "num_experts_per_tok": "experts_per_token",
    "moe_intermediate_size": "moe_ffn_hidden_size",
    "shared_expert_intermediate_size": "shared_expert_ffn_hidden_size",
    "decoder_sparse_step": "moe_layer_freq",
}
# GPT-2 style names (HF GPT2Config) for the same quantities.
GPT2_ALIASES: dict[str, str] = {
    "n_layer": "num_hidden_layers",
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "n_inner": "intermediate_size",
    "n_positions": "max_position_embeddings",
}
AUTOPAR_MODEL_KEYS: tuple[str, ...] = (
    "name",
    "_name_or_path",
    "aliases",
    "model_type",
    "architectures",
    "hidden_act",
    "mlp_kind",
    "position_embedding_type",
    "normalization",
    "add_bias_linear",
    "source",
)
REQUIRED_MODEL_KEYS: tuple[str, ...] = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "vocab_size",
)

MODEL_RANGES: dict[str, tuple[int, int]] = {
    # HF key -> (smallest, largest) accepted value, checked before any arithmetic. The maxima
    # are far beyond any published model (Llama-3.1 405B: 126 layers, hidden 16384, vocab 128k;
    # DeepSeek-V3: 256 experts) and keep every table autopar builds small.
    "num_hidden_layers": (1, 16_384),
    "hidden_size": (1, 1 << 20),
    "num_attention_heads": (1, 1 << 16),
    "num_key_value_heads": (1, 1 << 16),
    "intermediate_size": (1, 1 << 22),
    "vocab_size": (1, 1 << 24),
    "head_dim": (0, 1 << 16),
    "max_position_embeddings": (0, 1 << 31),
    "num_local_experts": (0, 1 << 16),
    "num_experts": (0, 1 << 16),
    "num_experts_per_tok": (0, 1 << 16),
    "moe_intermediate_size": (0, 1 << 22),
    "shared_expert_intermediate_size": (0, 1 << 22),
    "decoder_sparse_step": (1, 16_384),
}


def _model_integer(data: Mapping[str, Any], key: str, *, default: int | None = None) -> int:
    low, high = MODEL_RANGES[key]
    return integer(data, key, default=default, minimum=low, maximum=high)


def _is_hf_config(data: Mapping[str, Any]) -> bool:
    return any(key in data for key in ("architectures", "transformers_version", "torch_dtype"))


def _architecture_key(key: str, data: Mapping[str, Any]) -> bool:
    """A family's architecture key set to something in a config of another family."""
    return key in hf_families.ARCHITECTURE_KEYS and data[key] not in (None, False, 0)


def _check_model_keys(data: Mapping[str, Any]) -> None:
    """Unknown keys: an error in autopar files; in a downloaded HF config only near-misses of a
    key autopar reads are errors (HF configs carry many keys autopar does not need)."""
    known = [*MODEL_KEYS, *GPT2_ALIASES, *AUTOPAR_MODEL_KEYS]  # no model_type: no family's
    lenient = _is_hf_config(data)
    for key in data:
        if key in known:
            continue
        if (
            not lenient
            or _architecture_key(key, data)
            or difflib.get_close_matches(key, known, n=1, cutoff=0.85)
        ):
            raise unknown_key(key, known)


def _mlp_kind(data: Mapping[str, Any]) -> dict[str, str]:
    """``mlp_kind``; with ``activation`` too when a family's activation key gave both (read
    once: ``hf_details.detail_fields`` reads it only when an autopar ``mlp_kind`` is written)."""
    if "mlp_kind" in data:
        return {"mlp_kind": choice(data, "mlp_kind", ("swiglu", "gelu", "squared_relu"), "swiglu")}
    model_type = data.get("model_type")
    if model_type in hf_keys.FAMILIES and model_type != "nemotron_h":  # nemotron_h: its families
        mlp_kind, activation = hf_details.activation_of(data, str(model_type))  # gated per row
        return {"mlp_kind": mlp_kind, "activation": activation}
    act_key = "hidden_act" if "hidden_act" in data else "activation_function"
    act = string(data, act_key, "silu")
    if act in ("silu", "swish", "swiglu"):
        return {"mlp_kind": "swiglu"}
    activation = hf_details.ACTIVATION_NAMES.get(act)  # the ungated ones, as a family reads them
    if activation in hf_details.UNGATED_KINDS:
        return {"mlp_kind": hf_details.UNGATED_KINDS[activation]}
    raise InputError(
        f"cannot tell the MLP kind from {act_key} {excerpt(act)}; set mlp_kind to swiglu, gelu "
        "or squared_relu",
        field="mlp_kind",
    )


def model_from_mapping(data: Mapping[str, Any], *, name: str) -> ModelSpec:
    """A ``ModelSpec`` from HF-style keys (see ``MODEL_KEYS``). Errors name the key as the file
    wrote it (``n_layer`` in a GPT-2 config, ``num_hidden_layers`` in a Llama one)."""
    written = {GPT2_ALIASES.get(key, key): key for key in data}
    data = hf_families.unwrap({GPT2_ALIASES.get(key, key): v for key, v in data.items()})
    try:
        return _model_spec(data, name=name)
    except InputError as err:
        if err.field in written.values():  # already the key as the file wrote it
            raise
        hf_key = next((k for k, f in MODEL_KEYS.items() if f == err.field and k in data), None)
        hf_key = hf_key or next((k for k, f in MODEL_KEYS.items() if f == err.field), err.field)
        raise err.with_field(written.get(hf_key, hf_key)) from None


def _model_spec(data: Mapping[str, Any], *, name: str) -> ModelSpec:
    if "model_type" in data:  # a Hugging Face config (or a preset in its terms): hf_keys decides
        hf_details.check_keys(data, AUTOPAR_MODEL_KEYS)
    else:
        _check_model_keys(data)
    for key in REQUIRED_MODEL_KEYS:
        if data.get(key) is None:
            raise InputError("required key is missing", field=key)
    hidden = _model_integer(data, "hidden_size")
    heads = _model_integer(data, "num_attention_heads")
    mlp = _mlp_kind(data)
    mlp_kind = mlp["mlp_kind"]
    fields: dict[str, Any] = {
        "name": model_name(data, name),
        "num_layers": _model_integer(data, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": _model_integer(data, "num_key_value_heads", default=heads),
        "ffn_hidden_size": _model_integer(data, "intermediate_size", default=4 * hidden),
        "vocab_size": _model_integer(data, "vocab_size"),
        "head_dim": _model_integer(data, "head_dim", default=0),
        **mlp,
        # transformers' PretrainedConfig defaults tie_word_embeddings to True.
        "tied_embeddings": boolean(data, "tie_word_embeddings", True),
        "max_position_embeddings": _model_integer(data, "max_position_embeddings", default=0),
        "learned_position_embeddings": choice(
            data, "position_embedding_type", ("rope", "learned_absolute"), "rope"
        )
        == "learned_absolute",
        "layernorm": choice(
            data,
            "normalization",
            ("rmsnorm", "layernorm"),
            "layernorm" if mlp_kind == "gelu" else "rmsnorm",
        )
        == "layernorm",
        "linear_bias": boolean(data, "add_bias_linear", False),
        "num_experts": _model_integer(
            data, "num_local_experts", default=_model_integer(data, "num_experts", default=0)
        ),
        "experts_per_token": _model_integer(data, "num_experts_per_tok", default=0),
        "moe_ffn_hidden_size": _model_integer(data, "moe_intermediate_size", default=0),
        "shared_expert_ffn_hidden_size": _model_integer(
            data, "shared_expert_intermediate_size", default=0
        ),
        "moe_layer_freq": _model_integer(data, "decoder_sparse_step", default=1),
    }
    if fields["head_dim"] == hidden // heads:
        fields["head_dim"] = 0
    if not fields["num_experts"]:
        fields["experts_per_token"] = 0
    if "model_type" in data:
        fields |= hf_details.detail_fields(data, fields)
    return ModelSpec(**hf_families.family_fields(data, fields))
