"""Tensor shapes of a decoder-only transformer: parameter counts and per-layer GEMMs.

Everything here is plain arithmetic on ``ModelSpec`` fields, vectorised over numpy arrays of
layout values (``tp``, ``cp``, ``mbs`` ...). Names follow Megatron-LM:

- ``q`` = ``kv_channels * num_attention_heads`` (query projection size, ``h`` for most models);
- ``kv`` = ``kv_channels * num_kv_heads`` (one of K or V; GQA shrinks it);
- ``f`` = ``ffn_hidden_size``; gated MLPs (SwiGLU) have an up *and* a gate projection.

Sources: parameter terms follow Megatron ``megatron/training/theoretical_memory_usage.py``
(``compute_weight_and_optimizer_memory``); vocabulary padding follows Megatron
``megatron/core/tensor_parallel`` / ``vocab_utils.py`` (multiple of ``128 * tp``).
"""

from __future__ import annotations

import numpy as np

from autopar.specs import ModelSpec

VOCAB_PAD_MULTIPLE = 128
"""Megatron ``--make-vocab-size-divisible-by`` default (arguments.py); padded to 128 * tp."""


def padded_vocab(model: ModelSpec, tp: np.ndarray | int) -> np.ndarray:
    """Vocabulary padded to a multiple of ``128 * tp`` (Megatron ``_vocab_size_with_padding``)."""
    multiple = VOCAB_PAD_MULTIPLE * np.asarray(tp, dtype=np.float64)
    return np.ceil(model.vocab_size / multiple) * multiple


def query_size(model: ModelSpec) -> int:
    return model.kv_channels * model.num_attention_heads


def kv_size(model: ModelSpec) -> int:
    return model.kv_channels * model.num_kv_heads


def norm_params(model: ModelSpec) -> int:
    """Parameters of one norm: weight (RMSNorm) or weight + bias (LayerNorm)."""
    return (2 if model.layernorm else 1) * model.hidden_size


def attention_params(model: ModelSpec) -> int:
    """QKV and output projections (with GQA), their biases, and the layer's input norm."""
    h, q, kv = model.hidden_size, query_size(model), kv_size(model)
    weights = h * (q + 2 * kv) + q * h
    biases = (q + 2 * kv + h) if model.linear_bias else 0
    return weights + biases + norm_params(model)


def mlp_params(model: ModelSpec, ffn: int) -> int:
    """One MLP of inner size ``ffn`` (2 or 3 matrices) with its biases (no norm)."""
    h = model.hidden_size
    up = (2 if model.mlp_kind == "swiglu" else 1) * ffn
    biases = (up + h) if model.linear_bias else 0
    return h * up + ffn * h + biases


def dense_layer_params(model: ModelSpec) -> int:
    """A dense transformer layer: attention + MLP + the MLP's norm."""
    return attention_params(model) + mlp_params(model, model.ffn_hidden_size) + norm_params(model)


def moe_layer_non_expert_params(model: ModelSpec) -> int:
    """The parts of an MoE layer that live on the dense grid: attention, norm, router, shared
    expert (Megatron shards the shared expert with TP like a dense MLP)."""
    shared = (
        mlp_params(model, model.shared_expert_ffn_hidden_size)
        if model.shared_expert_ffn_hidden_size
        else 0
    )
    router = model.hidden_size * model.num_experts
    return attention_params(model) + norm_params(model) + router + shared


def expert_params(model: ModelSpec) -> int:
    """All routed experts of one MoE layer."""
    return model.num_experts * mlp_params(model, model.expert_ffn_hidden_size)


def stage_layers(num_layers: int, pp) -> np.ndarray:
    """Layers on the fullest pipeline stage. Megatron's even split gives ``num_layers / pp``;
    with an uneven split (``--decoder-first/last-pipeline-num-layers``, allowed by
    ``SearchOptions.uneven_pipeline``) the middle stages hold ``ceil(num_layers / pp)`` and the
    first and last stages the rest (``autopar.rules``): the ceiling covers both cases."""
    return np.ceil(num_layers / np.asarray(pp, dtype=np.float64))


def dense_block_params(model: ModelSpec) -> int:
    """Transformer-block parameters that TP x PP shard (everything but the routed experts and the
    embeddings), including the final norm."""
    return (
        model.num_dense_layers * dense_layer_params(model)
        + model.num_moe_layers * moe_layer_non_expert_params(model)
        + norm_params(model)
    )
