"""The assumptions behind an answer, echoed in every output (issue 11): the model (name and
parameter count), the GPUs, the sequence, the batch, the precision, the gradient dtype, the
training stack and the memory kept free. A plain JSON-ready dict (``inputs`` in the JSON
schemas); ``autopar.outputs.report`` prints it as one line."""

from __future__ import annotations

from typing import Any

from autopar.inputs.specs import GIB, ClusterSpec, ModelSpec, TrainingSpec


def parameter_count(model: ModelSpec) -> int:
    """All parameters (unpadded vocabulary), for the echo: per layer the QKV and output
    projections ``h*(q + 2kv) + q*h``, the MLP (``2`` or ``3`` matrices of ``h*f``), the
    routed experts, shared expert and router of MoE layers, biases and norms; the embedding, the
    output layer unless tied, learned positions. (The core may not import ``cost_models``;
    ``tests/test_stack.py`` checks this against ``cost_models.shapes``.)"""
    h, heads, kv_heads = model.hidden_size, model.num_attention_heads, model.num_kv_heads
    q, kv = model.kv_channels * heads, model.kv_channels * kv_heads
    norm = (2 if model.layernorm else 1) * h

    def mlp(ffn: int) -> int:
        up = (2 if model.gated_mlp else 1) * ffn
        return h * up + ffn * h + ((up + h) if model.linear_bias else 0)

    attention = h * (q + 2 * kv) + q * h + ((q + 2 * kv + h) if model.linear_bias else 0)
    dense = attention + 2 * norm + mlp(model.ffn_hidden_size)
    shared = mlp(model.shared_expert_ffn_hidden_size) if model.shared_expert_ffn_hidden_size else 0
    moe = attention + 2 * norm + h * model.num_experts + shared
    experts = model.num_experts * mlp(model.expert_ffn_hidden_size) if model.is_moe else 0
    embedding = model.vocab_size * h
    positions = model.max_position_embeddings * h if model.learned_position_embeddings else 0
    return (
        model.num_dense_layers * dense
        + model.num_moe_layers * (moe + experts)
        + norm
        + embedding * (1 if model.tied_embeddings else 2)
        + positions
    )


def inputs_dict(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    *,
    sources: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The assumptions; ``sources`` says, for a measured profile, where each collective's time
    comes from (``autopar.costs.comm.collective_sources``)."""

    return {
        "model": model.name,
        "parameters": parameter_count(model),
        "gpus": training.num_gpus,
        "gpu": cluster.gpu.name,
        "gpus_per_node": cluster.gpus_per_node,
        "seq_len": training.seq_len,
        "global_batch_sequences": training.global_batch_sequences,
        "global_batch_tokens": training.global_batch_tokens,
        "precision": training.precision,
        "grad_precision": training.grad_precision,
        "fp8_recipe": training.stack.fp8_recipe if training.precision == "fp8" else None,
        "low_precision_gemms": low_precision_gemms(training),
        "stack": training.stack.name,
        "stack_switches": training.stack.to_dict(),
        "memory_reserve_bytes": cluster.memory_reserve_bytes,
        "comm_profile": cluster.comm_profile_path,
        "collective_sources": sources,
    }


NVFP4_LINEARS: tuple[str, ...] = ("qkv", "proj", "fc1", "fc2")
"""The linear layers an NVFP4 recipe runs in FP4 (``cost_models.gemm.FP4_GEMMS``)."""


def low_precision_gemms(training: TrainingSpec) -> dict[str, str]:
    """Which GEMMs run below BF16 and in what: FP8 the stack's ``fp8_gemms``; NVFP4 the block
    linears in FP4 (fprop, dgrad and wgrad), the attention core in FP8 if listed, the rest
    BF16 (output layer, router)."""
    gemms = training.stack.fp8_gemms
    if training.precision == "fp8":
        return {gemm: "fp8" for gemm in gemms}
    if training.precision == "nvfp4":
        out = {gemm: "fp4" for gemm in gemms if gemm in NVFP4_LINEARS}
        return out | ({"attention": "fp8"} if "attention" in gemms else {})
    return {}


def inputs_text(inputs: dict[str, Any]) -> str:
    """One line for people: ``llama-3-70b (70.6B params) on 1024 x h100-sxm, ...``."""
    precision = inputs["precision"]
    if inputs.get("fp8_recipe"):
        precision += f" ({inputs['fp8_recipe']} scaling)"
    if inputs["precision"] == "nvfp4":
        fp4 = [g for g, d in (inputs.get("low_precision_gemms") or {}).items() if d == "fp4"]
        precision += f" (FP4 {','.join(fp4)}; the rest BF16)" if fp4 else " (no FP4 GEMM)"
    reserve = inputs.get("memory_reserve_bytes") or 0
    sources = inputs.get("collective_sources") or {}
    derived = sorted(k for k, v in sources.items() if v != "measured")
    comm = ""
    if sources:
        comm = f"; comm profile {inputs['comm_profile']}: measured " + ", ".join(
            sorted(k for k, v in sources.items() if v == "measured")
        )
        comm += "; " + ", ".join(f"{k} {sources[k]}" for k in derived) if derived else ""
    return (
        f"{inputs['model']} ({inputs['parameters'] / 1e9:.1f}B params) on {inputs['gpus']} x "
        f"{inputs['gpu']}, seq {inputs['seq_len']}, global batch "
        f"{inputs['global_batch_sequences']} seq ({inputs['global_batch_tokens']:,} tokens), "
        f"{precision}, grads {inputs['grad_precision']}, stack {inputs['stack']}"
        + (f", reserve {reserve / GIB:.1f} GiB" if reserve else "")
        + comm
    )
