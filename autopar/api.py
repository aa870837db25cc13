"""The Python API: ``solve``, ``evaluate`` (and ``sweep`` in ``autopar.sweeps.run``), taking the
CLI's options as keyword arguments (DESIGN §7).

One way through: options -> ``Problem`` (``make_problem``) -> ``Space`` (``build_space``) ->
CP-SAT model and search (``autopar.search.solver``) -> estimates; when nothing fits, this module
asks
``autopar.search.explain`` why. Callers that also emit launcher configs build the ``Problem`` once
and pass it on (``solve_problem``, ``evaluate_problem``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from autopar.base.axes import GIVEN_AXES, RECOMPUTE_MODES, SEARCH_AXES, ZERO_STAGES
from autopar.base.errors import InputError, excerpt
from autopar.costs.context import make_context
from autopar.costs.estimate import estimate
from autopar.costs.plugin import load_cost_model
from autopar.costs.terms import CostModel
from autopar.inputs import limits as bounds
from autopar.inputs.echo import inputs_dict
from autopar.inputs.loading import load_cluster, load_model, load_stack
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
from autopar.layout.plan import Estimate, Layout
from autopar.layout.rules import sequence_parallel_on
from autopar.layout.space import build_space
from autopar.layout.stages import (
    PIPELINE_PLANS,
    StagePlan,
    StageRecompute,
    check_plan,
    even_plan,
    parse_plan,
)
from autopar.search.explain import explain_infeasible
from autopar.search.solver import SolveResult, solve_space

DEFAULT_SEQ_LEN = 4096
DEFAULT_GLOBAL_BATCH_TOKENS = 4 * 1024 * 1024
"""4 Mi tokens per step when no batch is given (1024 sequences of 4096 tokens)."""
FIELD_FLAGS: dict[str, str] = {
    # spec field -> the flag a user types, for errors raised by the frozen specs
    "num_gpus": "--gpus",
    "grad_reduce_dtype": "--grad-precision",
    "global_batch": "--global-batch",
    "seq_len": "--seq-len",
    "grad_precision": "--grad-precision",
    "zero": "--zero",
    "recompute": "--recompute",
}
AXIS_MAXIMA: dict[str, int] = {"vpp": bounds.MAX_VPP, "mbs": bounds.MAX_MBS}
"""Pins, limits and evaluated values of an axis are bounded by ``bounds.MAX_GPUS`` unless
listed here (``autopar.inputs.limits``)."""


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


def _check_sizes(gpus: object, seq_len: object, pins: dict, lims: object) -> None:
    """Every number that sizes an enumeration, against its documented maximum
    (``autopar.inputs.limits``), before anything is enumerated."""
    bounds.check_int(gpus, source="--gpus", maximum=bounds.MAX_GPUS)
    bounds.check_int(seq_len, source="--seq-len", maximum=bounds.MAX_SEQ_LEN)
    if not isinstance(lims, dict):
        raise InputError(f"must map axes to limits, got {excerpt(lims)}", source="limits")
    for axis, value in pins.items():
        if value is not None:
            maximum = AXIS_MAXIMA.get(axis, bounds.MAX_GPUS)
            bounds.check_int(value, source=f"--{axis.replace('_', '-')}", maximum=maximum)
    for axis, value in lims.items():
        flag = f"--max-{str(axis).replace('_', '-')}"
        if axis not in SEARCH_AXES:
            raise InputError(f"unknown layout axis {excerpt(axis)}", source="limits")
        if value is not None:
            bounds.check_int(value, source=flag, maximum=AXIS_MAXIMA.get(axis, bounds.MAX_GPUS))


def _check_names(**names: object) -> None:
    for flag, value in names.items():
        if not isinstance(value, str):
            raise InputError(
                f"must be a name, got {excerpt(value)}", source=f"--{flag.replace('_', '-')}"
            )


def make_problem(
    *,
    model: str | ModelSpec,
    gpus: int,
    gpu: str | GpuSpec | None = None,
    gpus_per_node: int | None = None,
    cluster: str | None = None,
    comm_profile: str | None = None,
    global_batch: int | None = None,
    global_batch_tokens: int | None = None,
    seq_len: int = DEFAULT_SEQ_LEN,
    precision: str = "bf16",
    grad_precision: str | None = None,
    framework: str = "megatron",
    stack: str | StackSpec | None = None,
    flash_attention: bool | None = None,
    tp_comm_overlap: bool | None = None,
    overlap_grad_reduce: bool | None = None,
    overlap_param_gather: bool | None = None,
    pp_comm_overlap: bool | None = None,
    cp_comm_type: str | None = None,
    ep_comm_overlap: bool | None = None,
    fp8_recipe: str | None = None,
    fp8_gemms: str | Sequence[str] | None = None,
    cross_entropy_fusion: bool | None = None,
    dropout: bool | None = None,
    memory_reserve_gib: float | None = None,
    kernel_efficiency: float | None = None,
    optimizer_state_dtype: str | None = None,
    moe_dispatchers: str | Sequence[str] | None = None,
    recompute: str | Sequence[str] | None = None,
    zero: str | Sequence[int] | None = None,
    sequence_parallel: bool | None = None,
    allow_interleaving: bool = True,
    allow_cp: bool = True,
    allow_ep: bool = True,
    tp_within_node: bool = True,
    uneven_pipeline: bool = False,
    limits: dict[str, int] | None = None,
    **pins: int | None,
) -> Problem:
    """A ``Problem`` from the CLI's options (``pins``: ``tp=8`` etc. for the axes in
    ``autopar.base.axes.SEARCH_AXES``; ``limits``: maxima, e.g. ``{"pp": 16, "vpp": 12}``, where a
    limit on ``mbs`` replaces its search cap).

    ``stack`` names the training stack (``autopar stacks``; default ``DEFAULT_STACK``); the
    switch arguments (``flash_attention`` ... ``memory_reserve_gib``, and ``grad_precision`` for
    the stack's ``grad_reduce_dtype``) override it one by one."""
    arguments = dict(locals())
    unknown = set(pins) - set(SEARCH_AXES)
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    _check_sizes(gpus, seq_len, pins, {} if limits is None else limits)
    _check_names(precision=precision, framework=framework)
    if grad_precision is not None:
        _check_names(grad_precision=grad_precision)
    if stack is not None and not isinstance(stack, str | StackSpec):
        raise InputError(f"must be a stack name or file, got {excerpt(stack)}", source="--stack")
    spec_model = load_model(model)
    spec_cluster = load_cluster(
        gpu=gpu, cluster_file=cluster, gpus_per_node=gpus_per_node, comm_profile=comm_profile
    )
    spec_stack = load_stack(stack)
    # each stack switch is a keyword of this function under its StackSpec name (grad_precision
    # excepted: the stack's grad_reduce_dtype); tests/test_stack.py checks they all are
    switches = {k: arguments[k] for k in SWITCHES if k in arguments}
    switches["grad_reduce_dtype"] = grad_precision
    try:
        spec_stack = with_overrides(spec_stack, switches)
        spec_cluster = _with_reserve(spec_cluster, spec_stack, flag_given=memory_reserve_gib)
        training = TrainingSpec(
            num_gpus=gpus,
            grad_precision=spec_stack.grad_reduce_dtype,
            seq_len=seq_len,
            precision=precision,
            global_batch_sequences=_global_batch(global_batch, global_batch_tokens, seq_len),
            stack=spec_stack,
        )
        spec_cluster.gpu.peak_flop_per_s(precision)
        _check_fp8_recipe(spec_stack, spec_cluster.gpu, precision)
        options = SearchOptions(
            framework=framework,
            recompute=_modes(recompute, RECOMPUTE_MODES, "recompute", RECOMPUTE_MODES),
            zero_stages=_modes(zero, ZERO_STAGES, "zero", _default_zero(framework)),
            sequence_parallel=sequence_parallel,
            allow_interleaving=allow_interleaving,
            allow_cp=allow_cp,
            allow_ep=allow_ep,
            tp_within_node=tp_within_node,
            uneven_pipeline=uneven_pipeline,
            pins=tuple((k, v) for k, v in pins.items() if v is not None),
            maxima=tuple(sorted((k, v) for k, v in (limits or {}).items() if v is not None)),
        )
    except InputError as err:
        flag = FIELD_FLAGS.get(err.field or "", f"--{(err.field or 'options').replace('_', '-')}")
        raise InputError(err.rule, source=err.source or flag) from None
    return Problem(model=spec_model, cluster=spec_cluster, training=training, options=options)


PRE_BLACKWELL_GPUS: tuple[str, ...] = ("a100", "h100", "h200", "mi300")


def _check_fp8_recipe(stack: StackSpec, gpu: GpuSpec, precision: str) -> None:
    """MXFP8 needs Blackwell's block-scaled tensor cores (Megatron ``--fp8-recipe mxfp8``, TE
    ``MXFP8BlockScaling``); on an earlier preset it is bad input. Without FP8 it has no effect
    and is accepted."""
    if (
        precision == "fp8"
        and stack.fp8_recipe == "mxfp8"
        and gpu.name.startswith(PRE_BLACKWELL_GPUS)
    ):
        raise InputError(
            f"mxfp8 needs Blackwell tensor cores, {gpu.name} has none; use delayed, current "
            "or blockwise",
            field="fp8_recipe",
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


def _default_zero(framework: str) -> tuple[int, ...]:
    """Megatron: plain DDP or the distributed optimizer; torchtitan: FSDP (ZeRO-3) or DDP;
    DeepSpeed: ZeRO 0-1 (stages 2-3 do not combine with its pipeline engine)."""
    return {"megatron": (0, 1), "torchtitan": (0, 3), "deepspeed": (0, 1)}.get(framework, (0, 1))


def solve_problem(
    problem: Problem,
    *,
    top: int = 1,
    time_limit: float = 10.0,
    num_workers: int | None = None,
    cost_model: str | CostModel | None = None,
    pipeline_plan: str = "uniform",
) -> SolveResult:
    """The provably fastest layout of ``problem`` (and ``top - 1`` runners-up); when nothing
    fits, the result carries the explanation. ``pipeline_plan="per-stage"`` also chooses the
    layers of every pipeline chunk and each stage's recompute (``autopar.pipeline.search``: the
    ``top`` best distinct outer layouts, each with its best plan)."""
    check_solve_options(top=top, time_limit=time_limit, num_workers=num_workers)
    _check_pipeline_plan(pipeline_plan)
    deadline = time.perf_counter() + time_limit
    cm = load_cost_model(cost_model)
    ctx = make_context(problem)
    if pipeline_plan == "per-stage":
        from autopar.pipeline.search import solve_result

        result = solve_result(
            problem, ctx, cm, time_limit_s=time_limit, num_workers=num_workers or 1, top=top
        )
        inputs = inputs_dict(problem.model, problem.cluster, problem.training, comm=ctx.comm)
        result = dataclasses.replace(result, inputs=inputs)
        if result.status == "infeasible" and not (result.explanation or {}).get("nearest_miss"):
            # no outer layout at all: the rules conflict, which the uniform explanation names
            explanation = explain_infeasible(
                problem, build_space(problem), ctx, cm, deadline=deadline
            )
            result = dataclasses.replace(result, explanation=explanation)
        return result
    space = build_space(problem)
    left_s = max(0.0, deadline - time.perf_counter())  # the limit covers the set-up too
    result = solve_space(space, ctx, cm, top_k=top, time_limit_s=left_s, num_workers=num_workers)
    inputs = inputs_dict(problem.model, problem.cluster, problem.training, comm=ctx.comm)
    result = dataclasses.replace(result, inputs=inputs)
    if result.status == "infeasible":
        explanation = explain_infeasible(problem, space, ctx, cm, deadline=deadline)
    elif result.status == "unknown":
        explanation = {
            "summary": "the time limit ran out before any layout was found; raise --time-limit",
            "families": [],
            "nearest_miss": None,
            "suggestions": [],
            "cut_short": True,
        }
    else:
        return result
    return dataclasses.replace(result, explanation=explanation)


def check_solve_options(*, top: object, time_limit: object, num_workers: object) -> None:
    """``--top``, ``--time-limit`` (>= 0 and finite: NaN or a negative limit is an error, never
    "the time limit ran out") and ``--num-workers``, against their documented maxima."""
    bounds.check_int(top, source="--top", maximum=bounds.MAX_TOP)
    bounds.check_number(
        time_limit, source="--time-limit", maximum=bounds.MAX_TIME_LIMIT_S, inclusive=True
    )
    if num_workers is not None:
        bounds.check_int(num_workers, source="--num-workers", maximum=bounds.MAX_WORKERS)


def solve(
    *,
    top: int = 1,
    time_limit: float = 10.0,
    num_workers: int | None = None,
    cost_model: str | CostModel | None = None,
    pipeline_plan: str = "uniform",
    **options: Any,
) -> SolveResult:
    """The provably fastest layout (and ``top - 1`` runners-up) for the options of
    ``make_problem``; ``status`` says whether it is proven optimal."""
    return solve_problem(
        make_problem(**options),
        top=top,
        time_limit=time_limit,
        num_workers=num_workers,
        cost_model=cost_model,
        pipeline_plan=pipeline_plan,
    )


def _check_pipeline_plan(value: str) -> None:
    if value not in PIPELINE_PLANS:
        raise InputError(
            f"must be one of {', '.join(PIPELINE_PLANS)}, got {value!r}", source="--pipeline-plan"
        )


def layout_of(problem: Problem, *, pipeline_plan: str = "uniform", **values: Any) -> Layout:
    """The layout ``evaluate`` scores: the given axis values (``Layout`` attribute names; the
    others at their ``evaluate`` defaults), with ``dp`` and ``grad_accum`` from the products and
    sequence parallelism on with TP unless the problem's options say otherwise. Raises
    ``InputError`` naming the first rule the layout breaks (with a per-stage plan, the plan
    sets the split: the even-split rules do not apply)."""
    _check_pipeline_plan(pipeline_plan)
    given = {axis.layout_attr: axis for axis in GIVEN_AXES}
    unknown = set(values) - set(given)
    if unknown:
        raise TypeError(f"unknown layout value(s): {', '.join(sorted(unknown))}")
    chosen = {attr: values.get(attr, axis.default_for_evaluate) for attr, axis in given.items()}
    for attr, axis in given.items():
        value = chosen[attr]
        flag = f"--{attr.replace('_', '-')}"
        if axis.kind == "flag" and not isinstance(value, bool):
            raise InputError(f"must be true or false, got {excerpt(value)}", source=flag)
        if axis.kind == "size":
            maximum = AXIS_MAXIMA.get(axis.name, bounds.MAX_GPUS)
            chosen[attr] = bounds.check_int(value, source=flag, maximum=maximum)
        if axis.kind == "mode" and (isinstance(value, bool) or value not in axis.choices):
            choices = ", ".join(map(str, axis.choices))
            raise InputError(f"must be one of {choices}, got {excerpt(value)}", source=flag)
    tp, pp, cp, mbs = chosen["tp"], chosen["pp"], chosen["cp"], chosen["mbs"]
    num_gpus, batch = problem.training.num_gpus, problem.training.global_batch_sequences
    if num_gpus % (tp * pp * cp):
        raise InputError(
            f"tp*pp*cp = {tp * pp * cp} does not divide the GPU count ({num_gpus})",
            source="layout",
            field="GPU count",
        )
    dp = num_gpus // (tp * pp * cp)
    if batch % (mbs * dp):
        raise InputError(
            f"mbs*dp = {mbs * dp} does not divide the global batch ({batch})",
            source="layout",
            field="global batch",
        )
    layout = Layout(
        **chosen,
        dp=dp,
        grad_accum=batch // (mbs * dp),
        sequence_parallel=bool(sequence_parallel_on(problem, tp)),
    )
    skip = ("pins and limits", *(("layers vs PP",) if pipeline_plan == "per-stage" else ()))
    broken = build_space(problem).broken_rule(layout.grid_row(), skip=skip)
    if broken is not None:
        family, _, rule = broken.partition(": ")
        raise InputError(rule, source="layout", field=family)
    return layout


def evaluate_problem(
    problem: Problem,
    layout: Layout,
    *,
    cost_model: str | CostModel | None = None,
    plan: StagePlan | None = None,
) -> Estimate:
    """Score ``layout`` (from ``layout_of``) in ``problem`` with the cost model; with ``plan``
    (``plan_of``), run with that per-stage pipeline plan."""
    ctx, cm = make_context(problem), load_cost_model(cost_model)
    if plan is None:
        return estimate(layout, ctx, cm)
    from autopar.costs.stage_estimate import estimate_plan

    return estimate_plan(layout, plan, ctx, cm)


def plan_of(
    problem: Problem,
    layout: Layout,
    *,
    stage_layers: str | Sequence[int] | None = None,
    stage_recompute: str | None = None,
) -> StagePlan:
    """A per-stage plan for ``layout``: ``stage_layers`` per chunk (``pp*vpp`` entries, virtual
    stage order) and ``stage_recompute`` per stage (``none``, ``selective``, ``full:K``; one entry
    for all), or, without layers, the even split with the layout's recompute. Raises
    ``InputError`` naming the rule a plan breaks."""
    if stage_layers is None:
        even = even_plan(problem.model.num_layers, layout.pp, layout.vpp, StageRecompute())
        stage_layers = even.chunk_layers
    if stage_recompute is None:
        whole = max(problem.model.num_layers, 1)
        stage_recompute = f"full:{whole}" if layout.recompute == "full" else layout.recompute
    plan = parse_plan(
        pp=layout.pp, vpp=layout.vpp, stage_layers=stage_layers, stage_recompute=stage_recompute
    )
    check_plan(plan, num_layers=problem.model.num_layers, recompute_modes=RECOMPUTE_MODES)
    return plan


def evaluate(
    *,
    cost_model: str | CostModel | None = None,
    pipeline_plan: str = "uniform",
    stage_layers: str | Sequence[int] | None = None,
    stage_recompute: str | None = None,
    **options: Any,
) -> Estimate:
    """Score one layout: ``options`` are ``make_problem``'s plus the layout's values (``tp=8,
    pp=4, vpp=5, recompute="selective", ...``); ``dp`` and ``grad_accum`` follow from the GPU
    count and the batch. ``pipeline_plan="per-stage"`` (implied by ``stage_layers`` or
    ``stage_recompute``) scores it with a per-stage plan (``plan_of``)."""
    attrs = {axis.layout_attr for axis in GIVEN_AXES}
    values = {k: options.pop(k) for k in list(options) if k in attrs}
    problem = make_problem(**options)
    if stage_layers is not None or stage_recompute is not None:
        pipeline_plan = "per-stage"
    layout = layout_of(problem, pipeline_plan=pipeline_plan, **values)
    plan = None
    if pipeline_plan == "per-stage":
        plan = plan_of(problem, layout, stage_layers=stage_layers, stage_recompute=stage_recompute)
    return evaluate_problem(problem, layout, cost_model=cost_model, plan=plan)
