"""The options of a problem, grouped, and the ``Problem`` they build.

A problem is asked for in one vocabulary, the CLI's (``--gpus`` is ``gpus=``, ``--max-pp`` is
``max_pp=``), in three frozen groups:

- ``JobOptions``: what to train where: the model, the GPUs, the batch, the sequence, the
  precision;
- ``StackOptions``: the training stack and the switches that override it (``autopar.inputs.stack``
  declares each switch once; its keyword comes from there);
- ``SearchRequest``: what the search may choose: the framework's rules, allowed modes and
  features, pins (``tp=8``) and limits (``max_pp=16``).

``ProblemOptions.from_keywords`` sorts flat keywords into the groups (an unknown one is a
``TypeError`` with a did-you-mean); ``build_problem`` checks them and builds the frozen specs.
``make_problem(**keywords)`` is both in one call, the API's entry point.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from autopar.base.axes import PIPELINE_SCHEDULES, RECOMPUTE_MODES, SEARCH_AXES, ZERO_STAGES
from autopar.base.errors import InputError, excerpt
from autopar.inputs import limits as bounds
from autopar.inputs.frameworks import FRAMEWORK_SCHEDULES
from autopar.inputs.loading import load_cluster, load_model, load_stack
from autopar.inputs.reliability import reliability_from_values
from autopar.inputs.specs import (
    GIB,
    ClusterSpec,
    GpuSpec,
    ModelSpec,
    Problem,
    SearchOptions,
    TrainingSpec,
)
from autopar.inputs.stack import SWITCHES, StackSpec, with_overrides

DEFAULT_SEQ_LEN = 4096
DEFAULT_GLOBAL_BATCH_TOKENS = 4 * 1024 * 1024
"""4 Mi tokens per step when no batch is given (1024 sequences of 4096 tokens)."""
AXIS_MAXIMA: dict[str, int] = {"vpp": bounds.MAX_VPP, "mbs": bounds.MAX_MBS}
"""Pins, limits and evaluated values of an axis are bounded by ``bounds.MAX_GPUS`` unless
listed here (``autopar.inputs.limits``)."""
FIELD_FLAGS: dict[str, str] = {
    # spec field -> the flag a user types, for errors raised by the frozen specs
    "num_gpus": "--gpus",
    "grad_reduce_dtype": "--grad-precision",
    "global_batch": "--global-batch",
    "seq_len": "--seq-len",
    "grad_precision": "--grad-precision",
    "zero": "--zero",
    "recompute": "--recompute",
    "pipeline_schedule": "--pipeline-schedule",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOptions:
    """What to train, on what: the model, the GPUs, the batch and the precision."""

    model: str | ModelSpec
    """A preset name (``autopar models``) or a YAML / JSON file of Hugging Face keys."""
    gpus: int
    """GPUs in the job (``--gpus``)."""
    gpu: str | GpuSpec | None = None
    """A GPU preset (``autopar gpus``) or file; h100 unless the cluster file names one."""
    gpus_per_node: int | None = None
    cluster: str | None = None
    comm_profile: str | None = None
    global_batch: int | None = None
    """Sequences per step; or ``global_batch_tokens`` (default 4 Mi tokens)."""
    global_batch_tokens: int | None = None
    seq_len: int = DEFAULT_SEQ_LEN
    precision: str = "bf16"
    gpu_mtbf_hours: float | None = None
    """Hours between failures per GPU (``--gpu-mtbf-hours``); default: the cluster file's, else
    ``autopar.inputs.reliability.DEFAULT_GPU_MTBF_HOURS``."""
    restart_s: float | None = None
    """Seconds from a failure to training again (``--restart-s``)."""
    checkpoint_gb_per_s: float | None = None
    """Storage write bandwidth of one server, GB/s (``--checkpoint-gb-per-s``)."""
    train_tokens: float | None = None
    """Tokens the run trains on (``--train-tokens``): days to train."""
    gpu_hour_cost: float | None = None
    """Price of a GPU-hour (``--gpu-hour-cost``): the cost of the run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StackOptions:
    """The training stack (a preset, a file or a ``StackSpec``; ``None`` is the default stack)
    and the switches given one by one, by field name (``Switch.name``)."""

    stack: str | StackSpec | None = None
    switches: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchRequest:
    """What the search may choose, as the user asked for it (``SearchOptions`` once checked)."""

    framework: str = "megatron"
    recompute: str | Sequence[str] | None = None
    """Allowed recompute modes (``none,selective,full`` or ``any``; default all)."""
    zero: str | Sequence[int] | None = None
    """Allowed ZeRO stages (``0,1`` ... or ``any``; default per framework)."""
    pipeline_schedule: str | Sequence[str] | None = None
    """Allowed pipeline schedules (``1f1b,zb-v`` ... or ``any``: every one the framework ships;
    default ``default_schedules``)."""
    sequence_parallel: bool | None = None
    interleaving: bool = True
    """Allow interleaved 1F1B (``--interleaving/--no-interleaving``)."""
    context_parallel: bool = True
    """Allow CP (``--context-parallel/--no-context-parallel``)."""
    expert_parallel: bool = True
    """Allow EP (``--expert-parallel/--no-expert-parallel``)."""
    tp_within_node: bool = True
    uneven_pipeline: bool = True
    pins: tuple[tuple[str, int], ...] = ()
    """Fixed axis values (``tp=8``)."""
    limits: tuple[tuple[str, int], ...] = ()
    """Upper limits (``max_pp=16``; a limit on ``mbs`` replaces its search cap)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProblemOptions:
    """Everything that makes a ``Problem``, in its three groups (module docstring)."""

    job: JobOptions
    stack: StackOptions = field(default_factory=StackOptions)
    search: SearchRequest = field(default_factory=SearchRequest)

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any]) -> ProblemOptions:
        """The groups from flat keywords in the CLI's vocabulary: the fields of ``JobOptions``
        and ``SearchRequest``, ``stack`` and each switch's keyword, an axis name as a pin
        (``tp=8``), ``max_<axis>`` or ``limits={axis: value}`` as a limit."""
        keywords = {ALIASES.get(k, k): v for k, v in keywords.items()}
        unknown = sorted(set(keywords) - set(KEYWORDS))
        if unknown:
            raise TypeError(_unknown_text(unknown))
        if "model" not in keywords or "gpus" not in keywords:
            missing = [k for k in ("model", "gpus") if k not in keywords]
            raise TypeError(f"missing option(s): {', '.join(missing)}")
        job = JobOptions(**{k: keywords[k] for k in JOB_KEYS if k in keywords})
        switches = tuple(
            (s.name, keywords[s.keyword]) for s in SWITCHES if keywords.get(s.keyword) is not None
        )
        stack = StackOptions(stack=keywords.get("stack"), switches=switches)
        limits = keywords.get("limits") or {}
        if not isinstance(limits, dict):
            raise InputError(f"must map axes to limits, got {excerpt(limits)}", source="limits")
        limits = {**limits, **{k[4:]: v for k, v in keywords.items() if k in LIMIT_KEYS}}
        search = SearchRequest(
            **{k: keywords[k] for k in SEARCH_KEYS if k in keywords},
            pins=tuple((k, v) for k, v in keywords.items() if k in SEARCH_AXES and v is not None),
            limits=tuple((k, v) for k, v in limits.items() if v is not None),
        )
        return cls(job=job, stack=stack, search=search)


JOB_KEYS: tuple[str, ...] = tuple(f.name for f in fields(JobOptions))
SEARCH_KEYS: tuple[str, ...] = tuple(
    f.name for f in fields(SearchRequest) if f.name not in ("pins", "limits")
)
LIMIT_KEYS: tuple[str, ...] = tuple(f"max_{axis}" for axis in SEARCH_AXES)
KEYWORDS: tuple[str, ...] = (
    *JOB_KEYS,
    "stack",
    *(s.keyword for s in SWITCHES),
    *SEARCH_KEYS,
    *SEARCH_AXES,
    *LIMIT_KEYS,
    "limits",
)
"""Every keyword ``make_problem`` takes: the API's vocabulary, the CLI's flags with ``_``."""
ALIASES: dict[str, str] = {
    "allow_interleaving": "interleaving",
    "allow_cp": "context_parallel",
    "allow_ep": "expert_parallel",
}
"""Earlier API names, still accepted: each is the CLI flag's name now."""


def check_keywords(keywords: Mapping[str, Any], *, own: Sequence[str] = ()) -> None:
    """A ``TypeError`` naming each keyword that is neither ``make_problem``'s nor one of the
    caller's ``own`` (``solve``'s ``top``, ``time_limit``, ...), with a did-you-mean over both."""
    unknown = sorted(set(keywords) - set(KEYWORDS) - set(ALIASES) - set(own))
    if unknown:
        raise TypeError(_unknown_text(unknown, (*KEYWORDS, *own)))


def _unknown_text(unknown: list[str], known: Sequence[str] | None = None) -> str:
    known = KEYWORDS if known is None else known
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        parts.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return f"unknown option(s): {', '.join(parts)}"


def make_problem(**keywords: Any) -> Problem:
    """A ``Problem`` from the CLI's options as keywords (``ProblemOptions.from_keywords``):
    ``make_problem(model="llama-70b", gpus=1024, tp=8, max_pp=16, stack="nemo-24.07")``."""
    return build_problem(ProblemOptions.from_keywords(keywords))


def build_problem(options: ProblemOptions) -> Problem:
    """The frozen specs of ``options``, each number checked against its documented maximum
    before anything is loaded or enumerated; ``InputError`` names the flag and the rule."""
    job, search = _checked_sizes(options.job, options.search)
    _check_names(precision=job.precision, framework=search.framework)
    stack = options.stack.stack
    if stack is not None and not isinstance(stack, str | StackSpec):
        raise InputError(f"must be a stack name or file, got {excerpt(stack)}", source="--stack")
    for name, value in options.stack.switches:
        if name == "grad_reduce_dtype":
            _check_names(grad_precision=value)
    model = load_model(job.model)
    cluster = load_cluster(
        gpu=job.gpu,
        cluster_file=job.cluster,
        gpus_per_node=job.gpus_per_node,
        comm_profile=job.comm_profile,
    )
    try:
        cluster = _with_reliability(cluster, job)
        spec_stack = with_overrides(load_stack(stack), dict(options.stack.switches))
        reserve_given = dict(options.stack.switches).get("memory_reserve_gib")
        cluster = _with_reserve(cluster, spec_stack, flag_given=reserve_given)
        training = TrainingSpec(
            num_gpus=job.gpus,
            grad_precision=spec_stack.grad_reduce_dtype,
            seq_len=job.seq_len,
            precision=job.precision,
            global_batch_sequences=_global_batch(
                job.global_batch, job.global_batch_tokens, job.seq_len
            ),
            stack=spec_stack,
            train_tokens=_run_number(job.train_tokens, "--train-tokens", bounds.MAX_TRAIN_TOKENS),
            gpu_hour_cost=_run_number(
                job.gpu_hour_cost, "--gpu-hour-cost", bounds.MAX_GPU_HOUR_COST
            ),
            default_batch=job.global_batch is None and job.global_batch_tokens is None,
        )
        _check_precision(cluster.gpu, job.precision, spec_stack, gpu_source=_gpu_source(job))
        if spec_stack.cpu_offload_layers >= model.num_layers:
            raise InputError(
                f"must be below the model's {model.num_layers} layers (Megatron "
                "transformer_config.py L1884: offloading can be done only for layers less than "
                "num_layers)",
                source="--cpu-offload-layers",
            )
        if spec_stack.cpu_offload_layers and spec_stack.cuda_graphs == "layers":
            raise InputError(
                "per-layer CUDA graphs do not run with CPU offloading (Megatron "
                "transformer_config.py L2800-2801: 'CUDA graphs not supported with CPU "
                "offloading' unless --cuda-graph-impl full_iteration); use cuda_graphs full "
                "or none",
                source="--cpu-offload-layers",
            )
        search_options = _search_options(search, spec_stack)
    except InputError as err:
        flag = FIELD_FLAGS.get(err.field or "", f"--{(err.field or 'options').replace('_', '-')}")
        field = err.field if err.source else None  # a file's key stays named; a flag is the key
        raise InputError(err.rule, source=err.source or flag, field=field) from None
    return Problem(model=model, cluster=cluster, training=training, options=search_options)


def _with_reliability(cluster: ClusterSpec, job: JobOptions) -> ClusterSpec:
    """The cluster's failure model with the flags over the cluster file's values; a bad value
    is an ``InputError`` naming the flag."""
    flags = {
        "gpu_mtbf_hours": job.gpu_mtbf_hours,
        "restart_s": job.restart_s,
        "checkpoint_gb_per_s": job.checkpoint_gb_per_s,
    }
    if all(value is None for value in flags.values()):
        return cluster
    try:
        reliability = reliability_from_values(flags, base=cluster.reliability)
    except InputError as err:
        raise InputError(err.rule, source=f"--{(err.field or '').replace('_', '-')}") from None
    return dataclasses.replace(cluster, reliability=reliability)


def _run_number(value: object, flag: str, maximum: float) -> float | None:
    if value is None:
        return None
    return bounds.check_number(value, source=flag, maximum=maximum)


def _search_options(search: SearchRequest, stack: StackSpec) -> SearchOptions:
    framework = search.framework
    return SearchOptions(
        framework=framework,
        recompute=_modes(search.recompute, RECOMPUTE_MODES, "recompute", RECOMPUTE_MODES),
        zero_stages=_modes(search.zero, ZERO_STAGES, "zero", default_zero(framework)),
        pipeline_schedules=_schedules(search.pipeline_schedule, framework, stack),
        sequence_parallel=search.sequence_parallel,
        allow_interleaving=search.interleaving,
        allow_cp=search.context_parallel,
        allow_ep=search.expert_parallel,
        tp_within_node=search.tp_within_node,
        uneven_pipeline=search.uneven_pipeline,
        pins=search.pins,
        maxima=tuple(sorted(search.limits)),
    )


def _modes(value: str | Sequence[str] | None, allowed: tuple, name: str, default: tuple) -> tuple:
    if value is None:
        return default
    if not isinstance(value, str | list | tuple):
        raise InputError(
            f"must be a comma-separated list, got {excerpt(value)}", source=f"--{name}"
        )
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items[:16]:
        if not isinstance(item, str | int) or isinstance(item, bool):
            raise InputError(f"must be a list of names, got {excerpt(item)}", source=f"--{name}")
        item = str(item).strip()
        if item == "any":
            return allowed
        parsed = int(item) if allowed == ZERO_STAGES and item.isdigit() else item
        if parsed not in allowed:
            choices = ", ".join(map(str, allowed))
            raise InputError(
                f"must be among {choices} or 'any', got {excerpt(item)}", source=f"--{name}"
            )
        out.append(parsed)
    return tuple(out)


def _schedules(value: str | Sequence[str] | None, framework: str, stack: StackSpec) -> tuple:
    """``--pipeline-schedule``: names, or ``any`` for every schedule the framework ships
    (``FRAMEWORK_SCHEDULES``; one it does not ship is refused by ``SearchOptions``)."""
    if value is None:
        return default_schedules(framework, stack)
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(items, list | tuple) and "any" in [str(i).strip() for i in items]:
        return tuple(name for name, _ in FRAMEWORK_SCHEDULES.get(framework, ()))
    return _modes(value, PIPELINE_SCHEDULES, "pipeline-schedule", ())


def default_schedules(framework: str, stack: StackSpec) -> tuple[str, ...]:
    """Without ``--pipeline-schedule``: 1F1B (interleaved with VPP), as every framework runs by
    default (torchtitan ``pipeline_parallel_schedule = "1F1B"``, configs.py L216), and
    Megatron's combined 1F1B as well when the stack runs it (``ep_comm_overlap``)."""
    combined = framework == "megatron" and stack.ep_comm_overlap
    return ("1f1b", "combined-1f1b") if combined else ("1f1b",)


def _global_batch(global_batch: int | None, global_batch_tokens: int | None, seq_len: int) -> int:
    if global_batch is not None and global_batch_tokens is not None:
        raise InputError(
            "give --global-batch or --global-batch-tokens, not both", source="--global-batch"
        )
    if global_batch is not None:
        return bounds.check_int(
            global_batch, source="--global-batch", maximum=bounds.MAX_GLOBAL_BATCH
        )
    tokens = DEFAULT_GLOBAL_BATCH_TOKENS if global_batch_tokens is None else global_batch_tokens
    tokens = bounds.check_int(
        tokens, source="--global-batch-tokens", maximum=bounds.MAX_GLOBAL_BATCH_TOKENS
    )
    if tokens % seq_len:
        raise InputError(
            f"{tokens} tokens is not a whole number of {seq_len}-token sequences",
            source="--global-batch-tokens",
        )
    return bounds.check_int(
        tokens // seq_len, source="--global-batch-tokens", maximum=bounds.MAX_GLOBAL_BATCH
    )


def _checked_sizes(job: JobOptions, search: SearchRequest) -> tuple[JobOptions, SearchRequest]:
    """Every number that sizes an enumeration, against its documented maximum
    (``autopar.inputs.limits``), before anything is enumerated; the options with those numbers
    as ints (a numpy integer is taken, and becomes an int here)."""
    gpus = bounds.check_int(job.gpus, source="--gpus", maximum=bounds.MAX_GPUS)
    seq_len = bounds.check_int(job.seq_len, source="--seq-len", maximum=bounds.MAX_SEQ_LEN)
    pins = []
    for axis, value in search.pins:
        maximum = AXIS_MAXIMA.get(axis, bounds.MAX_GPUS)
        pins.append(
            (axis, bounds.check_int(value, source=f"--{axis.replace('_', '-')}", maximum=maximum))
        )
    limits = []
    for axis, value in search.limits:
        flag = f"--max-{str(axis).replace('_', '-')}"
        if axis not in SEARCH_AXES:
            raise InputError(f"unknown layout axis {excerpt(axis)}", source="limits")
        maximum = AXIS_MAXIMA.get(axis, bounds.MAX_GPUS)
        limits.append((axis, bounds.check_int(value, source=flag, maximum=maximum)))
    return (
        dataclasses.replace(job, gpus=gpus, seq_len=seq_len),
        dataclasses.replace(search, pins=tuple(pins), limits=tuple(limits)),
    )


def _check_names(**names: object) -> None:
    for flag, value in names.items():
        if not isinstance(value, str):
            raise InputError(
                f"must be a name, got {excerpt(value)}", source=f"--{flag.replace('_', '-')}"
            )


def _gpu_source(job: JobOptions) -> str:
    """Where the GPU's figures come from, for an error about one of them."""
    if job.cluster:
        return str(job.cluster)
    gpu = job.gpu if isinstance(job.gpu, str) else None
    return gpu if gpu and gpu.endswith((".yaml", ".yml", ".json")) else "--gpu"


def _check_precision(gpu: GpuSpec, precision: str, stack: StackSpec, *, gpu_source: str) -> None:
    """The GPU can run the precision and the FP8 recipe (hard rules of Transformer Engine,
    ``pytorch/quantization.py`` L162-175: MXFP8 and NVFP4 need compute capability 10.0), and
    its figures hold the peak the precision is priced at. Without FP8 the recipe has no effect
    and is accepted."""
    if precision == "nvfp4" and gpu.runs("nvfp4") and gpu.peak_fp4_flop_per_s is None:
        raise InputError(
            "is missing: --precision nvfp4 needs the GPU's dense FP4 peak",
            source=gpu_source,
            field="peak_fp4_tflop_per_s",
        )
    gpu.peak_flop_per_s(precision)
    if precision == "fp8" and stack.fp8_recipe == "mxfp8" and not gpu.runs("mxfp8"):
        raise InputError(
            f"mxfp8 needs block-scaled FP8 tensor cores (Blackwell or CDNA 4), {gpu.name} has "
            "none; use delayed, current or blockwise",
            source="--fp8-recipe",
        )


def _with_reserve(
    cluster: ClusterSpec, stack: StackSpec, *, flag_given: float | None
) -> ClusterSpec:
    """The memory each GPU keeps free: ``--memory-reserve-gib``, else the cluster file's
    ``memory_reserve_gib``, else the stack's. Below 0 or above the GPU's memory is bad input."""
    if flag_given is None and cluster.memory_reserve_bytes:
        return cluster
    reserve_gib = stack.memory_reserve_gib
    if reserve_gib * GIB > cluster.gpu.memory_bytes:
        raise InputError(
            f"must be at most the GPU's memory ({cluster.gpu.memory_bytes / GIB:.1f} GiB), "
            f"got {reserve_gib:g}",
            field="memory_reserve_gib",
        )
    return dataclasses.replace(cluster, memory_reserve_bytes=int(round(reserve_gib * GIB)))


def default_zero(framework: str) -> tuple[int, ...]:
    """Megatron: plain DDP or the distributed optimizer; torchtitan: FSDP (ZeRO-3) or DDP;
    DeepSpeed: ZeRO 0-1 (stages 2-3 do not combine with its pipeline engine)."""
    return {"megatron": (0, 1), "torchtitan": (0, 3), "deepspeed": (0, 1)}.get(framework, (0, 1))
