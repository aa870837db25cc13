"""The assumptions behind an answer, echoed in every output (issue 11): the model (name and
parameter count), the GPUs, the sequence, the batch, the precision, the gradient dtype, the
training stack and the memory kept free. A plain JSON-ready dict (``inputs`` in the JSON
schemas); ``autopar.report`` prints it as one line."""

from __future__ import annotations

from typing import Any

from autopar.specs import GIB, ClusterSpec, ModelSpec, TrainingSpec


def inputs_dict(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, *, comm: object = None
) -> dict[str, Any]:
    """The assumptions; ``comm`` (the context's collective model) adds, for a measured profile,
    where each collective's time comes from (``CommProfile.provenance``)."""
    from cost_models.shapes import total_params

    provenance = getattr(comm, "provenance", None)

    return {
        "model": model.name,
        "parameters": int(total_params(model)),
        "gpus": training.num_gpus,
        "gpu": cluster.gpu.name,
        "gpus_per_node": cluster.gpus_per_node,
        "seq_len": training.seq_len,
        "global_batch_sequences": training.global_batch_sequences,
        "global_batch_tokens": training.global_batch_tokens,
        "precision": training.precision,
        "grad_precision": training.grad_precision,
        "fp8_recipe": training.stack.fp8_recipe if training.precision == "fp8" else None,
        "stack": training.stack.name,
        "stack_switches": training.stack.to_dict(),
        "memory_reserve_bytes": cluster.memory_reserve_bytes,
        "comm_profile": cluster.comm_profile_path,
        "collective_sources": provenance() if callable(provenance) else None,
    }


def inputs_text(inputs: dict[str, Any]) -> str:
    """One line for people: ``llama-3-70b (70.6B params) on 1024 x h100-sxm, ...``."""
    precision = inputs["precision"]
    if inputs.get("fp8_recipe"):
        precision += f" ({inputs['fp8_recipe']} scaling)"
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
