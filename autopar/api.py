"""The Python API: ``solve``, ``evaluate`` (and ``sweep`` in ``autopar.sweep``), taking the CLI's
options as keyword arguments (DESIGN §7)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from autopar.context import make_context
from autopar.errors import InputError
from autopar.estimate import estimate
from autopar.loading import load_cluster, load_model
from autopar.plan import Estimate, Layout
from autopar.rules import layout_rules, products
from autopar.solver import SolveResult, run_solver
from autopar.space import build_space
from autopar.specs import (
    RECOMPUTE_MODES,
    ZERO_STAGES,
    GpuSpec,
    ModelSpec,
    Problem,
    SearchOptions,
    TrainingSpec,
)
from autopar.terms import CostModel

DEFAULT_SEQ_LEN = 4096
DEFAULT_GLOBAL_BATCH_TOKENS = 4 * 1024 * 1024
"""4 Mi tokens per step when no batch is given (1024 sequences of 4096 tokens)."""
PIN_DIMS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "grad_accum")


def _modes(value: str | Sequence[str] | None, allowed: tuple, name: str, default: tuple) -> tuple:
    if value is None:
        return default
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        item = str(item).strip()
        if item == "any":
            return allowed
        parsed = int(item) if allowed == ZERO_STAGES and item.isdigit() else item
        if parsed not in allowed:
            choices = ", ".join(map(str, allowed))
            raise InputError(f"must be among {choices} or 'any', got {item!r}", source=f"--{name}")
        out.append(parsed)
    return tuple(out)


def _global_batch(global_batch: int | None, global_batch_tokens: int | None, seq_len: int) -> int:
    if global_batch is not None and global_batch_tokens is not None:
        raise InputError(
            "give --global-batch or --global-batch-tokens, not both", source="--global-batch"
        )
    if global_batch is not None:
        return global_batch
    tokens = DEFAULT_GLOBAL_BATCH_TOKENS if global_batch_tokens is None else global_batch_tokens
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise InputError(
            f"must be a positive integer, got {tokens!r}", source="--global-batch-tokens"
        )
    if tokens % seq_len:
        raise InputError(
            f"{tokens} tokens is not a whole number of {seq_len}-token sequences",
            source="--global-batch-tokens",
        )
    return tokens // seq_len


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
    grad_precision: str = "fp32",
    framework: str = "megatron",
    recompute: str | Sequence[str] | None = None,
    zero: str | Sequence[int] | None = None,
    sequence_parallel: bool | None = None,
    allow_interleaving: bool = True,
    allow_cp: bool = True,
    allow_ep: bool = True,
    tp_within_node: bool = True,
    uneven_pipeline: bool = False,
    max_mbs: int = 16,
    max_vpp: int = 8,
    limits: dict[str, int] | None = None,
    **pins: int | None,
) -> Problem:
    """A ``Problem`` from the CLI's options (``pins``: ``tp=8`` etc.; ``limits``: maxima)."""
    unknown = set(pins) - set(PIN_DIMS)
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    spec_model = load_model(model)
    spec_cluster = load_cluster(
        gpu=gpu, cluster_file=cluster, gpus_per_node=gpus_per_node, comm_profile=comm_profile
    )
    try:
        training = TrainingSpec(
            num_gpus=gpus,
            grad_precision=grad_precision,
            seq_len=seq_len,
            precision=precision,
            global_batch_sequences=_global_batch(global_batch, global_batch_tokens, seq_len),
        )
        spec_cluster.gpu.peak_flop_per_s(precision)
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
            maxima=tuple(sorted((limits or {}).items())),
            max_mbs=max_mbs,
            max_vpp=max_vpp,
        )
    except InputError as err:
        raise err.with_source(
            f"--{err.field.replace('_', '-')}" if err.field else "options"
        ) from None
    problem = Problem(model=spec_model, cluster=spec_cluster, training=training, options=options)
    check_splittable(problem)
    return problem


def check_splittable(problem: Problem) -> None:
    """Bad input, not a search result: the GPUs and the batch cannot be split as
    ``tp*pp*cp*dp`` and ``mbs*dp*grad_accum`` under the model's rules (e.g. 7 GPUs and 1024
    sequences: dp must be 1 or 7, and 7 fits neither the batch nor the heads, layers or
    sequence). Pins and limits are left out: a pin that conflicts is a search result,
    explained as infeasible (exit 1) with the rule families it conflicts with."""
    unpinned = dataclasses.replace(
        problem, options=dataclasses.replace(problem.options, pins=(), maxima=())
    )
    space = build_space(unpinned)
    if not len(space.pruned_grid(("tp", "pp", "cp", "mbs", "grad_accum"))["tp"]):
        raise InputError(
            f"a global batch of {problem.training.global_batch_sequences} sequences cannot be "
            f"split as mbs*dp*grad_accum for any data-parallel size that "
            f"{problem.training.num_gpus} GPUs allow (heads {problem.model.num_attention_heads}, "
            f"layers {problem.model.num_layers}, sequence {problem.training.seq_len})",
            source="--global-batch",
        )


def _default_zero(framework: str) -> tuple[int, ...]:
    """Megatron: plain DDP or the distributed optimizer; torchtitan: FSDP (ZeRO-3) or DDP;
    DeepSpeed: ZeRO 0-1 (stages 2-3 do not combine with its pipeline engine)."""
    return {"megatron": (0, 1), "torchtitan": (0, 3), "deepspeed": (0, 1)}.get(framework, (0, 1))


def load_cost_model(spec: str | CostModel | None) -> CostModel:
    """The default cost model, or ``module:attr`` naming a CostModel or a factory of one."""
    if spec is None:
        from cost_models.default import default_cost_model

        return default_cost_model()
    if isinstance(spec, CostModel):
        return spec
    module_name, _, attr = str(spec).partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr or "default_cost_model")
    except (ImportError, AttributeError) as err:
        raise InputError(f"cannot load {spec!r} ({err})", source="--cost-model") from None
    obj = obj() if callable(obj) and not isinstance(obj, CostModel) else obj
    if not isinstance(obj, CostModel):
        raise InputError(f"{spec!r} is not an autopar.terms.CostModel", source="--cost-model")
    return obj


def solve(
    *,
    top: int = 1,
    time_limit: float = 10.0,
    num_workers: int | None = None,
    cost_model: str | CostModel | None = None,
    **options: Any,
) -> SolveResult:
    """The provably fastest layout (and ``top - 1`` runners-up) for the options of
    ``make_problem``; ``status`` says whether it is proven optimal."""
    if top < 1:
        raise InputError(f"must be >= 1, got {top}", source="--top")
    problem = make_problem(**options)
    cm = load_cost_model(cost_model)
    return run_solver(
        problem,
        make_context(problem),
        cm,
        top_k=top,
        time_limit_s=time_limit,
        num_workers=num_workers,
    )


def check_layout(problem: Problem, layout: Layout) -> None:
    """Raise ``InputError`` naming the first rule ``layout`` breaks."""
    row = {axis: np.array([value]) for axis, value in layout.grid_row().items()}
    for product in products(problem):
        total = int(np.prod([row[a][0] for a in product.axes]))
        if total != product.total:
            raise InputError(
                f"breaks {product.text}: got {total}", source="layout", field=product.family
            )
    for rule in layout_rules(problem):
        if rule.family != "pins and limits" and not bool(rule.check(row)[0]):
            raise InputError(
                f"breaks {rule.text} ({rule.source})", source="layout", field=rule.family
            )


def evaluate(
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int = 1,
    vpp: int = 1,
    mbs: int = 1,
    recompute: str = "none",
    zero: int = 1,
    sequence_parallel: bool | None = None,
    cost_model: str | CostModel | None = None,
    **options: Any,
) -> Estimate:
    """Score one layout; ``dp`` and ``grad_accum`` follow from the GPU count and the batch."""
    problem = make_problem(sequence_parallel=sequence_parallel, **options)
    for name, value in (
        ("tp", tp),
        ("pp", pp),
        ("cp", cp),
        ("ep", ep),
        ("etp", etp),
        ("vpp", vpp),
        ("mbs", mbs),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"must be a positive integer, got {value!r}", source=f"--{name}")
    if recompute not in RECOMPUTE_MODES:
        raise InputError(
            f"must be one of {', '.join(RECOMPUTE_MODES)}, got {recompute!r}", source="--recompute"
        )
    if zero not in ZERO_STAGES:
        raise InputError(f"must be one of 0, 1, 2, 3, got {zero!r}", source="--zero")
    n, batch = problem.training.num_gpus, problem.training.global_batch_sequences
    if n % (tp * pp * cp):
        raise InputError(
            f"tp*pp*cp = {tp * pp * cp} does not divide num_gpus ({n})",
            source="layout",
            field="GPU count",
        )
    dp = n // (tp * pp * cp)
    if batch % (mbs * dp):
        raise InputError(
            f"mbs*dp = {mbs * dp} does not divide global_batch ({batch})",
            source="layout",
            field="global batch",
        )
    sp = tp > 1 if sequence_parallel is None else bool(sequence_parallel) and tp > 1
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        etp=etp,
        vpp=vpp,
        mbs=mbs,
        grad_accum=batch // (mbs * dp),
        recompute=recompute,
        zero=zero,
        sequence_parallel=sp,
    )
    check_layout(problem, layout)
    return estimate(layout, make_context(problem), load_cost_model(cost_model))
