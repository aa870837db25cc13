"""Emitters: a layout as the launch configuration of a training framework (DESIGN §7).

Pure functions, no printing. Each takes an ``Estimate`` (or a bare ``Layout``) and the
``Problem`` it was solved for (the model's layer count, the sequence length, the global batch
and the precision are not part of a layout).

Flag and field names were checked against the frameworks' sources:

- Megatron-LM: ``megatron/training/arguments.py`` (``--tensor-model-parallel-size``,
  ``--num-layers-per-virtual-pipeline-stage``, ``--expert-tensor-parallel-size``,
  ``--fp8-format {e4m3,hybrid}``, ``--recompute-granularity {full,selective}``, ...).
- torchtitan: ``torchtitan/config/job_config.py`` (``[parallelism]``, ``[training]``,
  ``[activation_checkpoint] mode = "selective"|"full"|"none"``).
- DeepSpeed: ``deepspeed/runtime/config.py`` (``train_batch_size``,
  ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``zero_optimization``,
  ``bf16``, ``pipeline``) and ``deepspeed/runtime/tensor_parallel/config.py``
  (``tensor_parallel.autotp_size``).
"""

from __future__ import annotations

import json
from typing import Any

from autopar.errors import InputError
from autopar.plan import Estimate, Layout
from autopar.specs import Problem

EMITTERS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed")


def _layout(item: Estimate | Layout) -> Layout:
    return item.layout if isinstance(item, Estimate) else item


def uneven_end_layers(num_layers: int, pp: int) -> tuple[int, int]:
    """Layers of the first and last stage when ``pp`` does not divide ``num_layers``: the middle
    stages take ``ceil(L/pp)`` each (``autopar.rules.uneven_split_ok``), the ends share the rest,
    the first stage (which also holds the embedding) the smaller half."""
    middle = -(-num_layers // pp)
    rest = num_layers - (pp - 2) * middle
    return rest // 2, rest - rest // 2


def megatron_args(item: Estimate | Layout, problem: Problem) -> str:
    """Megatron-LM command-line arguments for the layout, one shell-pasteable line."""
    lay = _layout(item)
    model, training = problem.model, problem.training
    args: list[str] = [
        f"--tensor-model-parallel-size {lay.tp}",
        f"--pipeline-model-parallel-size {lay.pp}",
    ]
    if lay.vpp > 1:
        stages = lay.pp * lay.vpp
        if model.num_layers % stages:
            raise InputError(
                f"{model.num_layers} layers do not split into pp*vpp = {stages} stages",
                source="layout",
                field="vpp",
            )
        args.append(f"--num-layers-per-virtual-pipeline-stage {model.num_layers // stages}")
    elif model.num_layers % lay.pp:
        first, last = uneven_end_layers(model.num_layers, lay.pp)
        args.append(f"--decoder-first-pipeline-num-layers {first}")
        args.append(f"--decoder-last-pipeline-num-layers {last}")
    args.append(f"--context-parallel-size {lay.cp}")
    if model.num_experts:
        args.append(f"--expert-model-parallel-size {lay.ep}")
        args.append(f"--expert-tensor-parallel-size {lay.etp}")
    args += [
        f"--micro-batch-size {lay.mbs}",
        f"--global-batch-size {training.global_batch_sequences}",
        f"--seq-length {training.seq_len}",
    ]
    if lay.sequence_parallel:
        args.append("--sequence-parallel")
    if lay.zero >= 1:
        args += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    if lay.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif lay.recompute == "full":
        args.append(
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
        )
    args.append("--bf16")
    if training.grad_precision == "bf16":
        args.append("--grad-reduce-in-bf16")  # else bf16 implies FP32 gradient accumulation
    if training.precision == "fp8":
        args.append("--fp8-format hybrid")
    return " ".join(args)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))


def torchtitan_config(item: Estimate | Layout, problem: Problem) -> dict[str, dict[str, Any]]:
    """The torchtitan job-config sections (``[parallelism]``, ``[training]``,
    ``[activation_checkpoint]``) as nested dicts.

    ZeRO-3 is FSDP (``data_parallel_shard_degree = dp``) and ZeRO-2 FSDP that keeps parameters
    gathered after forward (``fsdp_reshard_after_forward = "never"``); otherwise plain DDP
    (``data_parallel_replicate_degree = dp``). torchtitan's ``local_batch_size`` is the batch of
    one DP rank per forward pass without PP, and per step (split into micro-batches of
    ``pipeline_parallel_microbatch_size``) with PP; ``global_batch_size`` then sets the
    gradient accumulation.
    """
    lay = _layout(item)
    training = problem.training
    fsdp = lay.zero >= 2
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": 1 if fsdp else lay.dp,
        "data_parallel_shard_degree": lay.dp if fsdp else 1,
        "tensor_parallel_degree": lay.tp,
        "pipeline_parallel_degree": lay.pp,
        "context_parallel_degree": lay.cp,
        "expert_parallel_degree": lay.ep,
    }
    if lay.zero == 2:
        parallelism["fsdp_reshard_after_forward"] = "never"
    if lay.pp > 1:
        parallelism["pipeline_parallel_microbatch_size"] = lay.mbs
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if lay.vpp > 1 else "1F1B"
        if lay.vpp > 1 and problem.model.num_layers % (lay.pp * lay.vpp) == 0:
            per_stage = problem.model.num_layers // (lay.pp * lay.vpp)
            parallelism["pipeline_parallel_layers_per_stage"] = per_stage
    local_batch = lay.mbs * lay.grad_accum if lay.pp > 1 else lay.mbs
    ac: dict[str, Any] = {"mode": lay.recompute}
    if lay.recompute == "selective":
        ac["selective_ac_option"] = "op"
    return {
        "parallelism": parallelism,
        "training": {
            "local_batch_size": local_batch,
            "global_batch_size": training.global_batch_sequences,
            "seq_len": training.seq_len,
        },
        "activation_checkpoint": ac,
    }


def torchtitan_toml(item: Estimate | Layout, problem: Problem) -> str:
    """``torchtitan_config`` as a TOML snippet to merge into a torchtitan job config."""
    blocks = []
    for section, fields in torchtitan_config(item, problem).items():
        lines = [f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def deepspeed_json(item: Estimate | Layout, problem: Problem) -> dict[str, Any]:
    """A DeepSpeed config dict with only keys DeepSpeed accepts.

    ``train_batch_size = mbs * grad_accum * dp`` (DeepSpeed's world size is the DP size when a
    model-parallel unit is given). TP is ``tensor_parallel.autotp_size`` (AutoTP training) and PP
    is ``pipeline.stages`` (``PipelineModule``); DeepSpeed has no ring context parallelism.
    """
    lay = _layout(item)
    if lay.cp > 1:
        raise InputError(
            f"DeepSpeed has no context parallelism (layout has cp={lay.cp})",
            source="--format deepspeed",
        )
    config: dict[str, Any] = {
        "train_batch_size": lay.mbs * lay.grad_accum * lay.dp,
        "train_micro_batch_size_per_gpu": lay.mbs,
        "gradient_accumulation_steps": lay.grad_accum,
        "zero_optimization": {"stage": lay.zero},
        "bf16": {"enabled": True},
    }
    if problem.training.grad_precision == "bf16":
        config["communication_data_type"] = "bf16"  # DeepSpeed's gradient reduction dtype
    if lay.tp > 1:
        config["tensor_parallel"] = {"autotp_size": lay.tp}
    if lay.pp > 1:
        pipeline: dict[str, Any] = {"stages": lay.pp}
        if lay.recompute == "full":
            pipeline["activation_checkpoint_interval"] = 1
        config["pipeline"] = pipeline
    return config
