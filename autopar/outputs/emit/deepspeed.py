"""DeepSpeed: a ``ds_config.json`` with only keys DeepSpeed reads, or a refusal (DESIGN §7).

Checked against the installed DeepSpeed 0.19.8: ``deepspeed/runtime/config.py``
(``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
``zero_optimization``, ``bf16``, ``communication_data_type``; ``get_pipeline_config`` keeps a
``pipeline`` dict of which ``runtime/pipe/engine.py`` reads ``activation_checkpoint_interval``,
``pipe_partitioned``, ``grad_partitioned``, never ``stages``) and
``deepspeed/runtime/tensor_parallel/config.py`` (``tensor_parallel.autotp_size``).

The pipeline size is not a config key: it is ``PipelineModule(layers, num_stages=pp)`` in the
training script (``deepspeed_notes`` says so). DeepSpeed has no interleaved pipeline, no expert
or context parallelism of Megatron's kind, and AutoTP has no sequence parallelism; a layout that
needs one is refused, naming the format that can express it.
"""

from __future__ import annotations

from typing import Any

from autopar.inputs.specs import Problem
from autopar.layout.plan import Estimate, Layout
from autopar.outputs.emit.common import (
    checkpoint_interval_of,
    layout_of,
    refuse,
    refuse_megatron_only,
    refuse_schedule,
)

DEEPSPEED_TARGET = "DeepSpeed 0.19.8"


def _check(lay: Layout) -> None:
    if lay.pipeline_schedule != "1f1b":  # engine.py L501 builds only schedule.TrainSchedule
        raise refuse_schedule("deepspeed", lay, "deepspeed")
    cannot = [
        (lay.vpp > 1, f"an interleaved pipeline (vpp={lay.vpp}): DeepSpeed's pipe engine is 1F1B"),
        (lay.ep > 1, f"expert parallelism (ep={lay.ep})"),
        (lay.etp > 1, f"expert tensor parallelism (etp={lay.etp})"),
        (lay.cp > 1, f"context parallelism (cp={lay.cp}): Ulysses is not ring attention"),
        (
            lay.sequence_parallel and lay.tp > 1,
            "sequence parallelism: AutoTP has none (solve with --no-sequence-parallel)",
        ),
        (
            lay.pp > 1 and lay.zero >= 2,
            f"ZeRO-{lay.zero} with pipeline parallelism (runtime/pipe/engine.py asserts stage < 2)",
        ),
    ]
    for bad, what in cannot:
        if bad:
            raise refuse("deepspeed", what, "use --format megatron or megatron-bridge")


def deepspeed_json(item: Estimate | Layout, problem: Problem) -> dict[str, Any]:
    """The DeepSpeed config dict; ``train_batch_size = mbs * grad_accum * dp`` (DeepSpeed's
    world size for batch checks is the DP size when a model-parallel unit is given)."""
    lay = layout_of(item)
    _check(lay)
    config: dict[str, Any] = {
        "train_batch_size": lay.mbs * lay.grad_accum * lay.dp,
        "train_micro_batch_size_per_gpu": lay.mbs,
        "gradient_accumulation_steps": lay.grad_accum,
        "zero_optimization": {"stage": lay.zero},
        "bf16": {"enabled": True},
    }
    if problem.training.precision == "fp8":
        raise refuse("deepspeed", "FP8 training (no DeepSpeed config key)", "use --format megatron")
    refuse_megatron_only("deepspeed", problem)
    stack = problem.training.stack
    if stack.async_checkpoint or not stack.ckpt_fully_parallel_save:
        what = "asynchronous" if stack.async_checkpoint else "first-replica"
        raise refuse("deepspeed", f"the {what} checkpoint save (no ds_config key)",
                     "use --format megatron or torchtitan")  # fmt: skip
    # the gradient-reduction dtype as planned: left unset, DeepSpeed reduces in the model dtype,
    # bf16 here (runtime/engine.py communication_data_type)
    config["communication_data_type"] = problem.training.grad_precision
    if lay.tp > 1:
        config["tensor_parallel"] = {"autotp_size": lay.tp}
    if lay.pp > 1 and lay.recompute == "full":
        config["pipeline"] = {"activation_checkpoint_interval": 1}  # pipe/engine.py:217
    return config


def deepspeed_notes(item: Estimate | Layout, problem: Problem) -> tuple[str, ...]:
    """The version targeted, and what the training script must do that the config cannot say."""
    lay = layout_of(item)
    notes = [
        f"{DEEPSPEED_TARGET} config for {problem.model.name} (JSON has no comments): "
        f"TP {lay.tp} x PP {lay.pp} x DP {lay.dp} = {lay.tp * lay.pp * lay.dp} GPUs."
    ]
    if lay.pp > 1:
        notes.append(
            f"DeepSpeed: the config has no pipeline size; build the model as "
            f"PipelineModule(layers, topology=PipeModelDataParallelTopology(num_pp={lay.pp}, "
            f"num_mp={lay.tp}, num_dp={lay.dp})) (the topology sets num_stages: "
            "runtime/pipe/module.py, runtime/pipe/topology.py)."
        )
    elif lay.tp > 1:
        notes.append(
            f"DeepSpeed: TP {lay.tp} is AutoTP (tensor_parallel.autotp_size); no pipeline."
        )
    if lay.recompute == "selective" or (lay.recompute == "full" and lay.pp == 1):
        what = "the attention core" if lay.recompute == "selective" else "each layer"
        notes.append(
            f"DeepSpeed: {lay.recompute} recomputation is in the model code: wrap {what} in "
            "deepspeed.checkpointing.checkpoint."
        )
    interval = checkpoint_interval_of(item)
    if interval is not None:
        notes.append(
            f"DeepSpeed: save a checkpoint every {interval} steps (engine.save_checkpoint)."
        )
    return tuple(notes)
