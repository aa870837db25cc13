"""What every emitter shares: the layout of an estimate, the uneven pipeline split, refusals."""

from __future__ import annotations

from autopar.base.errors import InputError
from autopar.inputs.frameworks import FRAMEWORK_SCHEDULES
from autopar.inputs.specs import ModelSpec, Problem
from autopar.inputs.stack import StackSpec
from autopar.layout.plan import Estimate, Layout
from autopar.layout.split import PipelineSplit, pipeline_split
from autopar.layout.stages import StagePlan


def layout_of(item: Estimate | Layout) -> Layout:
    return item.layout if isinstance(item, Estimate) else item


def stage_plan_of(item: Estimate | Layout) -> StagePlan | None:
    """The per-stage pipeline plan an estimate runs (``Estimate.per_stage``), if any."""
    if isinstance(item, Estimate) and item.per_stage is not None:
        return item.per_stage.plan
    return None


def dispatcher_of(item: Estimate | Layout) -> str:
    """The MoE token dispatcher the cost model priced for this layout (``Estimate.choices``);
    Megatron's ``alltoall`` when it made no choice (a bare ``Layout``)."""
    choices = item.choices if isinstance(item, Estimate) else {}
    return choices.get("moe_token_dispatcher", "alltoall")


def split_of(num_layers: int, pp: int, vpp: int, *, mtp_layers: int = 0) -> PipelineSplit:
    """The pipeline split the solver planned and priced (``autopar.layout.split``), or an error
    for a layout with none."""
    split = pipeline_split(num_layers, pp, vpp, mtp_layers=mtp_layers)
    if split is None:
        raise InputError(
            f"{num_layers} layers do not split over pp={pp} ranks of vpp={vpp} stages",
            source="layout",
            field="vpp" if vpp > 1 else "pp",
        )
    return split


def virtual_stage_layers(num_layers: int, pp: int, vpp: int, *, mtp_layers: int = 0) -> list[int]:
    """Transformer layers of each virtual stage (stage ``c*pp + r`` is chunk ``c`` of rank
    ``r``, Megatron's interleaving) in the planned split (``PipelineSplit.chunk_layers``)."""
    return list(split_of(num_layers, pp, vpp, mtp_layers=mtp_layers).chunk_layers)


def refuse_stage_plan(fmt: str) -> InputError:
    """The refusal of a format that cannot express a per-stage pipeline plan (``Format``)."""
    return InputError(
        "cannot express a per-stage pipeline plan (layers per chunk, recompute per stage); "
        "use --format megatron, json or table, or --pipeline-plan uniform",
        source=f"--format {fmt}",
        field="pipeline plan",
    )


MEGATRON_SCHEDULES: frozenset[str] = frozenset(dict(FRAMEWORK_SCHEDULES["megatron"]))
SCHEDULE_FORMATS: dict[str, str] = {
    "megatron": "megatron or megatron-bridge",
    "torchtitan": "torchtitan",
    "deepspeed": "deepspeed",
}


def schedule_formats(schedule: str) -> str:
    """The ``--format`` values that run ``schedule`` (``FRAMEWORK_SCHEDULES``)."""
    ships = [f for f, names in FRAMEWORK_SCHEDULES.items() if schedule in dict(names)]
    return " or ".join(SCHEDULE_FORMATS[f] for f in ships)


def refuse_schedule(fmt: str, lay: Layout, framework: str) -> InputError:
    """The refusal of a schedule the format's framework does not ship."""
    offered = ", ".join(dict(FRAMEWORK_SCHEDULES[framework]))
    return refuse(
        fmt,
        f"the {lay.pipeline_schedule} pipeline schedule ({framework} runs {offered})",
        f"use --format {schedule_formats(lay.pipeline_schedule)}",
    )


def refuse(fmt: str, what: str, instead: str) -> InputError:
    """The one-line refusal of a format that cannot express part of a layout."""
    return InputError(f"cannot express {what}; {instead}", source=f"--format {fmt}")


def selective_modules(model: ModelSpec, stack: StackSpec) -> list[str] | None:
    """Megatron ``--recompute-modules`` for selective recomputation: the stack's
    ``recompute_modules`` that apply to the model (``mla_up_proj`` to MLA, ``moe_act`` to MoE:
    transformer_config.py L1964-1972 refuses them elsewhere); ``None`` when that is Megatron's
    default, ``["core_attn"]`` (L1940-1941)."""
    modules = [
        m
        for m in stack.recompute_modules
        if (m != "mla_up_proj" or model.is_mla) and (m != "moe_act" or model.is_moe)
    ]
    return None if modules == ["core_attn"] else modules


def check_graphs_and_offload(fmt: str, lay: Layout, stack: StackSpec) -> None:
    """Megatron's rules for CUDA graphs and CPU offloading with the layout
    (transformer_config.py at d98e8a6): offloading only without pipeline parallelism and
    recomputation (L1891-1899); full recomputation graphed only as a whole iteration
    (L2854-2858); graphed attention not recomputed selectively with attention dropout
    (L2878-2884)."""
    if stack.cpu_offload_layers and (lay.pp > 1 or lay.recompute != "none"):
        raise refuse(
            fmt,
            f"CPU offloading with pp={lay.pp}, recompute {lay.recompute} (Megatron offloads "
            "only without pipeline parallelism and recomputation)",
            "solve with --cpu-offload-layers, which keeps to pp 1 and no recompute",
        )
    if stack.cuda_graphs == "layers" and lay.recompute == "full":
        raise refuse(
            fmt,
            "per-layer CUDA graphs with full recomputation (Megatron graphs full recompute "
            "only as a whole iteration)",
            "use cuda_graphs full",
        )
    if stack.cuda_graphs != "none" and stack.dropout and lay.recompute == "selective":
        raise refuse(
            fmt,
            "graphed attention recomputed selectively with attention dropout (Megatron "
            "transformer_config.py L2878-2884)",
            "set dropout false or recompute none",
        )


LLAMA3_FIXED = (1.0, 4.0, 8192)
"""megatron-core's Llama-3.1 RoPE scaling keeps low/high frequency factors 1 and 4 and 8192
original positions (``rotary_pos_embedding.py`` ``_apply_scaling``); only the factor is a
field (``rope_scaling_factor``)."""


def refuse_unbuildable_rope(fmt: str, model: ModelSpec, instead: str) -> None:
    """What megatron-core's RoPE cannot build, for every format that builds through it (Megatron
    and Megatron-Bridge): a second base for local layers, llama3 scaling off 1/4/8192."""
    rope = model.rope
    if rope.local_theta and rope.local_theta != rope.theta:
        raise refuse(fmt, "a second RoPE base for local layers", instead)
    if rope.scaling != "llama3":
        return
    fixed = (rope.low_freq_factor, rope.high_freq_factor, rope.original_max_position_embeddings)
    if fixed != LLAMA3_FIXED:
        raise refuse(
            fmt,
            f"llama3 RoPE scaling with low/high frequency factors {fixed[0]:g}/{fixed[1]:g} "
            f"and {fixed[2]} original positions (megatron-core fixes 1/4/8192)",
            instead,
        )


def refuse_megatron_only(fmt: str, problem: Problem, *, nvfp4: str = "") -> None:
    """NVFP4 training and CPU activation offloading are Megatron(-Bridge) settings (Transformer
    Engine's ``NVFP4BlockScaling``, ``cpu_offloading_num_layers``): a format without them
    refuses rather than drop them (without the offload the layout may not fit). ``nvfp4`` says
    where the format keeps its own FP4 recipe, if it has one."""
    if problem.training.precision == "nvfp4":
        raise refuse(fmt, f"NVFP4 training{nvfp4}", "use --format megatron or megatron-bridge")
    if problem.training.stack.cpu_offload_layers:
        raise refuse(
            fmt,
            f"CPU activation offloading of {problem.training.stack.cpu_offload_layers} layers",
            "use --format megatron or megatron-bridge",
        )


def _runs(flags: list[int]) -> str:
    """``[0, 0, 1]`` -> ``"[0]*2+[1]*1"``."""
    runs: list[list[int]] = []
    for flag in flags:
        if runs and runs[-1][0] == flag:
            runs[-1][1] += 1
        else:
            runs.append([flag, 1])
    return "+".join(f"[{flag}]*{count}" for flag, count in runs)


def ffn_pattern(model: ModelSpec) -> str | None:
    """Which layers hold an MoE MLP, as the list expression Megatron's ``--moe-layer-freq``
    evaluates (arguments.py ``moe_freq_type``; 1 = MoE): a repeated unit where the layers
    repeat one (HF ``decoder_sparse_step``), else run lengths (DeepSeek's dense-first layers);
    None when every layer is MoE (Megatron's default)."""
    flags = [int(kind.endswith("/moe")) for kind in model.layer_kinds]
    if all(flags):
        return None
    n = len(flags)
    for period in range(1, n // 2 + 1):
        unit = flags[:period]
        if (unit * (n // period + 1))[:n] == flags:
            whole, rest = divmod(n, period)
            tail = f"+{_runs(unit[:rest])}" if rest else ""
            return f"({_runs(unit)})*{whole}{tail}"
    return _runs(flags)


def unsupported_layers(model: ModelSpec) -> list[str]:
    """Layer features the Megatron-style emitters do not write (sliding-window and Mamba mixers,
    MLP-less layers, attention sinks): they refuse rather than drop them."""
    kinds = set(model.layer_kinds)  # a few distinct kinds over up to hundreds of layers
    mixers = {kind.split("/")[0] for kind in kinds}
    missing = sorted(mixers & {"sliding", "mamba", "none"})
    if any(kind.endswith("/none") for kind in kinds):
        missing.append("MLP-less layers")
    if model.attention_sinks:
        missing.append("attention sinks")
    return missing


def checkpoint_interval_of(item: Estimate | Layout) -> int | None:
    """The goodput-optimal checkpoint interval in steps of an estimate (``None`` for a bare
    layout, or a cost model without a checkpoint term)."""
    goodput = item.goodput if isinstance(item, Estimate) else None
    return goodput.checkpoint_interval_steps if goodput is not None else None
