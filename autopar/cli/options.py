"""Options shared by every command (``--gpus``, ``--model``, ...), declared once."""

from __future__ import annotations

from typing import Annotated, Any

import typer

Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Preset name (autopar models) or a YAML/JSON file with Hugging Face config.json keys.",
    ),
]
Gpus = Annotated[int, typer.Option("--gpus", "-n", help="Number of GPUs in the job.")]
Gpu = Annotated[
    str | None,
    typer.Option(
        "--gpu",
        help="GPU preset (autopar gpus) or YAML file; default h100 unless --cluster names one.",
    ),
]
GpusPerNode = Annotated[
    int | None, typer.Option("--gpus-per-node", help="NVLink domain size (default: the GPU's).")
]
Cluster = Annotated[
    str | None, typer.Option("--cluster", help="Cluster YAML: gpu, overrides, comm_profile.")
]
CommProfile = Annotated[
    str | None,
    typer.Option("--comm-profile", help="Communication profile YAML from `autopar calibrate`."),
]
GlobalBatch = Annotated[int | None, typer.Option("--global-batch", help="Sequences per step.")]
GlobalBatchTokens = Annotated[
    int | None,
    typer.Option(
        "--global-batch-tokens", help="Tokens per step (default 4Mi when no batch is given)."
    ),
]
SeqLen = Annotated[int, typer.Option("--seq-len", help="Sequence length in tokens.")]
Precision = Annotated[str, typer.Option("--precision", help="bf16 or fp8.")]
GradPrecision = Annotated[
    str,
    typer.Option(
        "--grad-precision",
        help="Gradient buffer/reduction: fp32 (Megatron-LM default) or bf16 (NeMo default).",
    ),
]
Framework = Annotated[
    str, typer.Option("--framework", help="megatron, torchtitan or deepspeed rules.")
]
CostModelOpt = Annotated[
    str | None,
    typer.Option("--cost-model", help="module:attr of a CostModel (default: cost_models.default)."),
]
Format = Annotated[
    str, typer.Option("--format", "-f", help="table, json, csv, megatron, torchtitan or deepspeed.")
]
Output = Annotated[
    str | None, typer.Option("--output", "-o", help="Write to this file (atomically).")
]


COMMON_KEYS: tuple[str, ...] = (
    "model", "gpus", "gpu", "gpus_per_node", "cluster", "comm_profile", "global_batch",
    "global_batch_tokens", "seq_len", "precision", "grad_precision", "framework",
)  # fmt: skip


def common(values: dict[str, Any], *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The shared options of a command (pass its ``locals()``) as Python API keyword arguments."""
    return {key: values[key] for key in COMMON_KEYS if key not in skip}


UnevenPipeline = Annotated[
    bool,
    typer.Option(
        "--uneven-pipeline/--even-pipeline",
        help="Allow PP sizes that do not divide the layers (Megatron "
        "--decoder-first/last-pipeline-num-layers).",
    ),
]
