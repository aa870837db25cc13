"""torchtitan: a layout as 0.3.x ``--section.key`` overrides or a 0.2.x TOML snippet (DESIGN §7).

torchtitan 0.3 reads no TOML: a run is ``--module M --config F`` (a ``config_registry`` function
returning ``Trainer.Config``) plus ``--section.key value`` overrides parsed by tyro
(``torchtitan/config/manager.py``); activation checkpointing is a subcommand
(``activation_checkpoint:full|selective|none``, ``distributed/activation_checkpoint.py``), and PP
needs ``--training.disable_cuda_graphs`` (``trainer.py`` ``_validate_cuda_graphs``). torchtitan
0.2.x reads a TOML job config (``torchtitan/config/job_config.py``; its fields are vendored in
``tests/data/consumers/``). The model is named only by a config function: ``TORCHTITAN_MODELS``
lists those for the decoders autopar has presets of, each with the file and line it comes from.

Both versions split the pipeline in ``distributed/pipeline_parallel.py``: the embedding and the
output count as ``pipeline_parallel_first/last_stage_less_layers`` layers (default 1 each), so
``L / (pp*vpp)`` layers per stage gives one stage too many unless both are set; they are set here
so the stages hold exactly the layers autopar planned (0 when even, the shortfall of the end
stages when uneven).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from autopar.inputs.specs import ModelSpec, Problem
from autopar.layout.plan import Estimate, Layout
from autopar.layout.stage_rules import equal_middle_sizes, one_recompute_mode
from autopar.layout.stages import StagePlan
from autopar.outputs.emit.common import (
    checkpoint_interval_of,
    layout_of,
    refuse,
    refuse_megatron_only,
    refuse_schedule,
    stage_plan_of,
    virtual_stage_layers,
)

TORCHTITAN_SCHEDULES: dict[str, str] = {
    "1f1b": "1F1B",
    "zb-h1": "InterleavedZeroBubble",
    "zb-v": "ZBVZeroBubble",
    "dualpipe-v": "DualPipeV",
    "gpipe": "GPipe",
    "looped-bfs": "LoopedBFS",
}
"""``parallelism.pipeline_parallel_schedule`` of each autopar schedule (the names torch's
``get_schedule_class`` maps, schedules.py L3878-3904; ``1f1b`` is ``Interleaved1F1B`` with
virtual stages)."""
TORCHTITAN_TARGET = "torchtitan 0.3.0"
TORCHTITAN_02_TARGET = "torchtitan 0.2.2"

ARCH_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "vocab_size",
    "num_experts",
    "experts_per_token",
    "moe_ffn_hidden_size",
    "num_mtp_layers",
    "rope_theta",
    "rope_scaling",
    "rope_factor",
)
"""The fields a torchtitan config must share with the model: the shapes and the RoPE (base,
scaling kind and factor; torchtitan's llama3 configs are Llama-3.1's, scaled x8)."""


@dataclass(frozen=True)
class TorchtitanModel:
    """One of torchtitan's own model configs: the 0.3 ``--module``/``--config`` pair, the 0.2
    ``[model]`` flavor (under the same name; empty where autopar writes no 0.2 model section),
    and the architecture as autopar reads it (``ARCH_FIELDS``), which
    tests/test_emit_consumers.py checks against the model torchtitan 0.3 builds."""

    module: str
    config: str
    flavor_02: str
    source: str  # the config_registry function, models/<module>/config_registry.py:line
    arch: tuple[int | float | str, ...]
    refuse_03: str = ""  # why 0.3's config function does not train what autopar plans


# Every torchtitan 0.3.0 config_registry function for a decoder autopar has a preset for.
# torchtitan 0.3 picks the model only through its config function (``Trainer.Config.model_spec``
# is ``tyro.conf.Suppress``ed, trainer.py:77): a flavor without a function (qwen3 "235B-A22B",
# models/qwen3/__init__.py:609) cannot be named on the command line.
TORCHTITAN_MODELS: tuple[TorchtitanModel, ...] = (
    TorchtitanModel(
        "llama3", "llama3_8b", "8B", "models/llama3/config_registry.py:184",
        (32, 4096, 32, 8, 128256, 0, 0, 0, 0, 500000.0, "llama3", 8.0),
    ),
    TorchtitanModel(
        "llama3", "llama3_70b", "70B", "models/llama3/config_registry.py:257",
        (80, 8192, 64, 8, 128256, 0, 0, 0, 0, 500000.0, "llama3", 8.0),
    ),
    TorchtitanModel(
        "llama3", "llama3_405b", "405B", "models/llama3/config_registry.py:295",
        (126, 16384, 128, 8, 128256, 0, 0, 0, 0, 500000.0, "llama3", 8.0),
        refuse_03="its only config, llama3_405b, trains in FP8 with rowwise scaling "
        "(Float8LinearConverter, models/llama3/config_registry.py:300-308), a recipe autopar "
        "does not plan",
    ),
    TorchtitanModel(
        "qwen3", "qwen3_30b_a3b", "30B-A3B", "models/qwen3/config_registry.py:295",
        (48, 2048, 32, 4, 151936, 128, 8, 768, 0, 1000000.0, "none", 1.0),
    ),
    TorchtitanModel(
        "gpt_oss", "gpt_oss_20b", "", "models/gpt_oss/config_registry.py:70",
        (24, 2880, 64, 8, 201088, 32, 4, 2880, 0, 150000.0, "yarn", 32.0),
    ),
    TorchtitanModel(
        "gpt_oss", "gpt_oss_120b", "", "models/gpt_oss/config_registry.py:101",
        (36, 2880, 64, 8, 201088, 128, 4, 2880, 0, 150000.0, "yarn", 32.0),
    ),
    TorchtitanModel(
        # Kimi-K2's decoder; the model adds a 27-layer MoonViT vision encoder
        # (models/kimi_k2_7/__init__.py:453, model.py:34)
        "kimi_k2_7", "kimi_k2_5", "", "models/kimi_k2_7/config_registry.py:170",
        (61, 7168, 64, 64, 163840, 384, 8, 2048, 0, 50000.0, "yarn", 64.0),
        refuse_03="its config, kimi_k2_5, is Kimi-K2.5: this decoder with a vision encoder, "
        "trained with the Muon optimizer (models/kimi_k2_7/config_registry.py:170-184); autopar "
        "plans the decoder with Adam",
    ),
    TorchtitanModel(
        # no MTP: _671b(num_mtp_layers=0), models/deepseek_v3/__init__.py:537
        "deepseek_v3", "deepseek_v3_671b", "", "models/deepseek_v3/config_registry.py:206",
        (61, 7168, 128, 128, 129280, 256, 8, 2048, 0, 10000.0, "yarn", 40.0),
    ),
)  # fmt: skip


def architecture(model: ModelSpec) -> tuple[int | float | str, ...]:
    rope = model.rope
    factor = rope.factor if rope.scaling != "none" else 1.0
    shapes = tuple(getattr(model, name) for name in ARCH_FIELDS[:-3])
    return (*shapes, rope.theta, rope.scaling, factor)


def torchtitan_model(model: ModelSpec) -> TorchtitanModel | None:
    """torchtitan's config for exactly this architecture, or None."""
    arch = architecture(model)
    return next((known for known in TORCHTITAN_MODELS if known.arch == arch), None)


def _nearest(model: ModelSpec) -> str:
    """What tells the model apart from a torchtitan config of its depth and width that differs
    in at most two more fields (a variant of it), if there is one."""
    arch = architecture(model)
    for known in TORCHTITAN_MODELS:
        diff = [
            f"{name} {theirs} (the model has {ours})"
            for name, theirs, ours in zip(ARCH_FIELDS, known.arch, arch, strict=True)
            if theirs != ours
        ]
        if known.arch[:2] == arch[:2] and len(diff) <= 2:
            return f"; the nearest, {known.config}, has " + ", ".join(diff)
    return ""


def _check(lay: Layout, problem: Problem, fmt: str, *, etp_equal_tp_ok: bool) -> None:
    """0.2 allows etp = 1 or tp and always pairs TP with SP; 0.3 has etp = 1 (no expert TP:
    EP borrows FSDP and TP ranks, ``config/configs.py:279``) and an SP switch.
    Both reduce gradients in FP32 only (``mixed_precision_reduce: Literal["float32"]``)."""
    where = (
        " (0.2.2 has float8 and mx converters only, components/quantization/)"
        if fmt == "torchtitan-0.2"
        else ": torchtitan 0.3 sets it in a config_registry function (NVFP4LinearConverter, "
        "components/quantization/nvfp4.py)"
    )
    refuse_megatron_only(fmt, problem, nvfp4=where)
    if problem.training.grad_precision == "bf16":
        raise refuse(
            fmt,
            "BF16 gradient reduction (mixed_precision_reduce is float32 only)",
            "use --format megatron",
        )
    if lay.zero == 1:
        raise refuse(
            fmt,
            "ZeRO-1: torchtitan shards with FSDP (ZeRO-2/3) or not at all",
            "solve with --framework torchtitan, or use --format megatron",
        )
    if lay.etp > 1 and not (etp_equal_tp_ok and lay.etp == lay.tp):
        allowed = "1 or tp" if etp_equal_tp_ok else "1"
        raise refuse(
            fmt,
            f"expert tensor parallelism etp={lay.etp} (torchtitan allows {allowed})",
            "use --format megatron",
        )
    _check_expert_mesh(lay, fmt, etp=lay.etp if etp_equal_tp_ok else 1)
    if etp_equal_tp_ok and lay.tp > 1 and not lay.sequence_parallel:
        raise refuse(
            fmt,
            "TP without sequence parallelism (0.2 always pairs them)",
            "solve with --sequence-parallel, or use --format torchtitan",
        )


def _check_expert_mesh(lay: Layout, fmt: str, *, etp: int) -> None:
    """torchtitan takes the EP x ETP ranks of the expert mesh from ``dp_shard * cp * tp`` (the
    FSDP shard is the whole DP only under FSDP): ``efsdp = dp_shard*cp*tp // (etp*ep)``
    (0.2.2 ``distributed/parallel_dims.py:138``; 0.3 ``config/configs.py``
    ``expert_parallel_degree``). When ``etp*ep`` does not divide it the mesh is zero-sized or
    does not cover the world (mixtral-8x7b on 64 GPUs with DDP and EP 8)."""
    shard = lay.dp if lay.zero >= 2 else 1
    if lay.ep > 1 and (shard * lay.cp * lay.tp) % (etp * lay.ep):
        mode = "FSDP" if lay.zero >= 2 else "DDP (no FSDP shard)"
        raise refuse(
            fmt,
            f"ep={lay.ep} x etp={etp} with {mode}: torchtitan takes expert ranks from "
            f"dp_shard*cp*tp = {shard * lay.cp * lay.tp}, which they do not divide",
            "solve with --framework torchtitan (FSDP), or use --format megatron",
        )


def _pipeline(
    lay: Layout, problem: Problem, fmt: str, plan: StagePlan | None = None
) -> dict[str, Any]:
    """torchtitan gives every virtual stage ``layers_per_stage`` layers but the first and the
    last, which hold ``first/last_stage_less_layers`` fewer: that is autopar's split when only
    those two differ (even, embedding/loss accounted, uneven without interleaving), or a
    per-stage ``plan``'s when its chunks have that shape (``_check_stage_plan``)."""
    if plan is not None:
        _check_stage_plan(plan, fmt)
    if lay.pp == 1:
        return {}
    model = problem.model
    if plan is not None:
        sizes = list(plan.chunk_layers)
    else:
        sizes = virtual_stage_layers(
            model.num_layers, lay.pp, lay.vpp, mtp_layers=model.num_mtp_layers
        )
    per_stage = max(sizes)
    if not equal_middle_sizes(sizes):
        raise refuse(
            fmt,
            f"the uneven split {sizes} (only the first and last virtual stage may be shorter: "
            "pipeline_parallel_layers_per_stage, distributed/pipeline_parallel.py, is the split "
            "autopar writes; module_fqns_per_model_part reaches 0.3's command line as one "
            "module per stage, tyro)",
            "use --format megatron",
        )
    name = TORCHTITAN_SCHEDULES.get(lay.pipeline_schedule)
    if name is None:
        raise refuse_schedule(fmt, lay, "torchtitan")
    if name == "1F1B" and lay.vpp > 1:
        name = "Interleaved1F1B"
    return {
        "pipeline_parallel_schedule": name,
        "pipeline_parallel_microbatch_size": lay.mbs,
        "pipeline_parallel_layers_per_stage": per_stage,
        "pipeline_parallel_first_stage_less_layers": per_stage - sizes[0],
        "pipeline_parallel_last_stage_less_layers": per_stage - sizes[-1],
    }


def _check_stage_plan(plan: StagePlan, fmt: str) -> None:
    """A per-stage plan's recompute as torchtitan runs it: one activation checkpoint mode for
    every layer of every stage (``distributed/activation_checkpoint.py`` ``apply_ac`` wraps
    each transformer block alike), so the stages agree and ``full`` covers every layer: the
    rule the per-stage search already holds torchtitan's plans to (``autopar.layout.stage_rules``),
    checked again here for a plan given to evaluate."""
    if not one_recompute_mode(plan):
        texts = ",".join(r.text() for r in plan.recompute)
        raise refuse(
            fmt,
            f"the per-stage recompute {texts} (torchtitan applies one activation checkpoint "
            "mode to every layer, distributed/activation_checkpoint.py apply_ac)",
            "use --format megatron",
        )


def _parallelism(
    lay: Layout, problem: Problem, fmt: str, plan: StagePlan | None = None
) -> dict[str, Any]:
    """ZeRO-3 is FSDP (``data_parallel_shard_degree = dp``), ZeRO-2 FSDP that keeps parameters
    gathered after forward (``fsdp_reshard_after_forward = "never"``), ZeRO-0 DDP."""
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
    return parallelism | _pipeline(lay, problem, fmt, plan)


def _training(lay: Layout, problem: Problem) -> dict[str, Any]:
    """``local_batch_size`` is one DP rank's batch per forward pass without PP and per step
    (split into ``pipeline_parallel_microbatch_size`` micro-batches) with PP;
    ``global_batch_size`` then sets the gradient accumulation (``configs.py TrainingConfig``)."""
    return {
        "local_batch_size": lay.mbs * lay.grad_accum if lay.pp > 1 else lay.mbs,
        "global_batch_size": problem.training.global_batch_sequences,
        "seq_len": problem.training.seq_len,
    }


def torchtitan_config(item: Estimate | Layout, problem: Problem) -> dict[str, dict[str, Any]]:
    """The torchtitan 0.2.x job-config sections as nested dicts."""
    lay = layout_of(item)
    _check(lay, problem, "torchtitan-0.2", etp_equal_tp_ok=True)
    sections: dict[str, dict[str, Any]] = {}
    known = torchtitan_model(problem.model)
    model: dict[str, Any] = {}
    if known and known.flavor_02:
        model = {"name": known.module, "flavor": known.flavor_02}
    if problem.training.precision == "fp8":
        converters = ["quantize.linear.float8"]
        if problem.model.is_moe:
            converters.append("quantize.grouped_mm.float8")
        model["converters"] = converters  # components/quantization/float8.py:238
    if model:
        sections["model"] = model
    parallelism = _parallelism(lay, problem, "torchtitan-0.2", stage_plan_of(item))
    if problem.model.is_moe:
        parallelism["expert_tensor_parallel_degree"] = lay.etp
    sections["parallelism"] = parallelism
    sections["training"] = _training(lay, problem)
    ac: dict[str, Any] = {"mode": lay.recompute}
    if lay.recompute == "selective":
        ac["selective_ac_option"] = "op"
    sections["activation_checkpoint"] = ac
    checkpoint = _checkpoint(item, problem, "torchtitan-0.2")
    if checkpoint:
        sections["checkpoint"] = checkpoint
    return sections


def _checkpoint(item: Estimate | Layout, problem: Problem, fmt: str) -> dict[str, Any]:
    """``checkpoint.interval`` (the goodput-optimal one) and ``checkpoint.async_mode``
    (``components/checkpointer/dcp.py`` L116); DCP always spreads the shards, so the
    first-replica save has no torchtitan spelling."""
    stack = problem.training.stack
    if not stack.ckpt_fully_parallel_save:
        raise refuse(
            fmt,
            "the first-replica checkpoint save (torchtitan's DCP writes every shard once, "
            "spread over its holders)",
            "drop --no-ckpt-fully-parallel-save, or use --format megatron",
        )
    out: dict[str, Any] = {}
    interval = checkpoint_interval_of(item)
    if interval is not None:
        out["interval"] = interval
    if stack.async_checkpoint:
        out["async_mode"] = "async"
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def torchtitan_toml(item: Estimate | Layout, problem: Problem) -> str:
    """``torchtitan_config`` as a TOML snippet to merge into a torchtitan 0.2.x job config."""
    blocks = [f"# autopar: {TORCHTITAN_02_TARGET} job config sections for {problem.model.name}"]
    for section, fields in torchtitan_config(item, problem).items():
        lines = [f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def torchtitan_args(item: Estimate | Layout, problem: Problem) -> list[str]:
    """torchtitan 0.3 command-line arguments: ``--module``, ``--config``, overrides and the
    activation-checkpoint subcommand (which tyro wants last)."""
    lay = layout_of(item)
    fmt = "torchtitan"
    _check(lay, problem, fmt, etp_equal_tp_ok=False)
    known = torchtitan_model(problem.model)
    if known is None:
        names = ", ".join(m.config for m in TORCHTITAN_MODELS if not m.refuse_03)
        raise refuse(
            fmt,
            f"{problem.model.name}: torchtitan 0.3 has no config for it (it has {names})"
            + _nearest(problem.model),
            "write a config_registry function, or use --format megatron",
        )
    if known.refuse_03:
        other = "torchtitan-0.2 or megatron" if known.flavor_02 else "megatron"
        raise refuse(fmt, f"{problem.model.name}: {known.refuse_03}", f"use --format {other}")
    if problem.training.precision == "fp8":
        raise refuse(
            fmt,
            "FP8: torchtitan 0.3 sets it in a config_registry function (model converters)",
            "use --format torchtitan-0.2 or megatron",
        )
    args = ["--module", known.module, "--config", known.config]
    for section, fields in (
        ("parallelism", _parallelism(lay, problem, fmt, stage_plan_of(item))),
        ("training", _training(lay, problem)),
    ):
        for key, value in fields.items():
            args += [f"--{section}.{key}", str(value)]
    if lay.tp > 1 and not lay.sequence_parallel:
        args.append("--parallelism.no-enable-sequence-parallel")
    for key, value in _checkpoint(item, problem, fmt).items():
        args += [f"--checkpoint.{key}", str(value)]
    if lay.pp > 1 or lay.ep > 1:
        args.append("--training.disable-cuda-graphs")
    args.append(f"activation_checkpoint:{lay.recompute}")
    return args


def torchtitan_text(item: Estimate | Layout, problem: Problem) -> str:
    """``torchtitan_args`` as a header comment and one command line."""
    args = torchtitan_args(item, problem)
    return "\n".join(
        [
            f"# autopar: {TORCHTITAN_TARGET} overrides for {problem.model.name}",
            "torchrun --nproc_per_node 8 -m torchtitan.train " + " ".join(args),
        ]
    )
