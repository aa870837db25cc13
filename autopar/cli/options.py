"""Options shared by every command (``--gpus``, ``--model``, ...), declared once, and the layout
options generated from the axes table (``autopar.base.axes``): ``solve``'s pins (``--tp 8``) and
limits (``--max-pp 16``), ``evaluate``'s layout values (``--tp 8 --recompute full``)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, Literal

import typer

from autopar.base.axes import AXES, GIVEN_AXES, Axis
from autopar.cli.help import CLUSTER, LAYOUT, MODEL, OUTPUT, SEARCH, STACK, TRAINING
from autopar.inputs.stack import SWITCHES, Switch

Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Preset name (autopar models) or a YAML/JSON file with Hugging Face config.json keys.",
        rich_help_panel=MODEL,
    ),
]
Gpus = Annotated[
    int, typer.Option("--gpus", "-n", help="Number of GPUs in the job.", rich_help_panel=CLUSTER)
]
Gpu = Annotated[
    str | None,
    typer.Option(
        "--gpu",
        help="GPU preset (autopar gpus) or YAML file; default h100 unless --cluster names one.",
        rich_help_panel=CLUSTER,
    ),
]
GpusPerNode = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node", help="NVLink domain size (default: the GPU's).", rich_help_panel=CLUSTER
    ),
]
Cluster = Annotated[
    str | None,
    typer.Option(
        "--cluster", help="Cluster YAML: gpu, overrides, comm_profile.", rich_help_panel=CLUSTER
    ),
]
CommProfile = Annotated[
    str | None,
    typer.Option(
        "--comm-profile",
        help="Communication profile YAML from `autopar calibrate`.",
        rich_help_panel=CLUSTER,
    ),
]
GlobalBatch = Annotated[
    int | None, typer.Option("--global-batch", help="Sequences per step.", rich_help_panel=TRAINING)
]
GlobalBatchTokens = Annotated[
    int | None,
    typer.Option(
        "--global-batch-tokens",
        help="Tokens per step (default 4Mi when no batch is given).",
        rich_help_panel=TRAINING,
    ),
]
SeqLen = Annotated[
    int, typer.Option("--seq-len", help="Sequence length in tokens.", rich_help_panel=TRAINING)
]
Precision = Annotated[
    str, typer.Option("--precision", help="bf16 or fp8.", rich_help_panel=TRAINING)
]
Stack = Annotated[
    str | None,
    typer.Option(
        "--stack",
        help="Training stack preset (autopar stacks) or YAML file; default megatron-lm.",
        rich_help_panel=STACK,
    ),
]
Framework = Annotated[
    str | None,
    typer.Option(
        "--framework",
        help="megatron, torchtitan or deepspeed rules (default: the framework --format "
        "launches, else megatron).",
        rich_help_panel=SEARCH,
    ),
]
CostModelOpt = Annotated[
    str | None,
    typer.Option(
        "--cost-model",
        help="A registered cost model (default, megatron-compatible) or module:attr "
        "(docs/cost-models.md).",
        rich_help_panel=SEARCH,
    ),
]
Format = Annotated[
    str,
    typer.Option(
        "--format",
        "-f",
        help="table, json, csv, megatron, megatron-bridge, torchtitan (0.3), torchtitan-0.2 or "
        "deepspeed.",
        rich_help_panel=OUTPUT,
    ),
]
Output = Annotated[
    str | None,
    typer.Option("--output", "-o", help="Write to this file (atomically).", rich_help_panel=OUTPUT),
]


COMMON_KEYS: tuple[str, ...] = (
    "model", "gpus", "gpu", "gpus_per_node", "cluster", "comm_profile", "global_batch",
    "global_batch_tokens", "seq_len", "precision", "framework",
)  # fmt: skip


def _switch_option(item: Switch) -> Any:
    """The typer annotation of one stack switch, from its declaration (``autopar.inputs.stack``):
    ``--x/--no-x`` for a boolean, the values it takes in the help of the others."""
    values = f" ({', '.join(item.choices)})" if item.choices and item.kind is str else ""
    listed = f" (comma list of {','.join(item.choices)})" if item.kind is tuple else ""
    flag = f"{item.flag}/--no-{item.flag[2:]}" if item.kind is bool else item.flag
    kind = {bool: bool, float: float, int: int}.get(item.kind, str)
    help_text = f"{item.help}{values}{listed} [stack]"
    return Annotated[kind | None, typer.Option(flag, help=help_text, rich_help_panel=STACK)]


STACK_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("stack", Stack),
    *((item.keyword, _switch_option(item)) for item in SWITCHES),
)
"""The training-stack options every problem-building command takes (``--stack`` and each
switch of it), all defaulting to the stack's own value; ``with_stack_options`` adds them."""


def common(values: dict[str, Any], *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The shared options of a command (pass its ``locals()``) as Python API keyword arguments,
    the stack options (``stack_options``) and the failure model (``failure_options``,
    ``autopar.cli.failure_options``) included."""
    out = {key: values[key] for key in COMMON_KEYS if key not in skip}
    return {**out, **values.get("stack_options", {}), **(values.get("failure_options") or {})}


def with_option_group(
    func: Callable, extra: list[inspect.Parameter], into: str, *, given_only: bool = False
) -> Callable:
    """Give a command function, which takes the keyword ``into``, the options ``extra``: typer
    reads the generated signature; the function receives their values as one dict (with
    ``given_only``, only those not ``None``)."""
    names = [p.name for p in extra]
    signature = inspect.signature(func, eval_str=True)
    params = [p for p in signature.parameters.values() if p.name != into]
    head = [p for p in params if p.kind is not p.VAR_KEYWORD]
    tail = [p for p in params if p.kind is p.VAR_KEYWORD]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        group = {name: kwargs.pop(name) for name in names if name in kwargs}
        if given_only:
            group = {k: v for k, v in group.items() if v is not None}
        return func(*args, **{into: group}, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*head, *extra, *tail])
    return wrapper


def with_stack_options(func: Callable) -> Callable:
    """Give a command function, which takes ``stack_options``, the options of ``STACK_OPTIONS``
    (``with_option_group``)."""
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
        for name, kind in STACK_OPTIONS
    ]
    return with_option_group(func, extra, "stack_options")


PipelinePlan = Annotated[
    str,
    typer.Option(
        "--pipeline-plan",
        help="uniform (every stage alike) or per-stage (layers per pipeline chunk and each "
        "stage's recompute chosen too).",
        rich_help_panel=SEARCH,
    ),
]
StageLayers = Annotated[
    str | None,
    typer.Option(
        "--stage-layers",
        help="Layers of every pipeline chunk, pp*vpp comma-separated counts in virtual stage "
        "order (implies --pipeline-plan per-stage).",
        rich_help_panel=LAYOUT,
    ),
]
StageRecompute = Annotated[
    str | None,
    typer.Option(
        "--stage-recompute",
        help="Recompute per stage: none, selective or full:K (K layers of each chunk); one "
        "entry for all stages or one per stage (implies --pipeline-plan per-stage).",
        rich_help_panel=LAYOUT,
    ),
]
UnevenPipeline = Annotated[
    bool,
    typer.Option(
        "--uneven-pipeline/--even-pipeline",
        help="Allow pipeline splits that are not even (the default; launched as Megatron's "
        "uneven-split or --pipeline-model-parallel-layout flags); --even-pipeline keeps even "
        "splits only.",
        rich_help_panel=SEARCH,
    ),
]


def _option(
    name: str, kind: type, default: Any, help_text: str, panel: str = LAYOUT
) -> inspect.Parameter:
    flag = "--" + name.replace("_", "-")
    if kind is bool:
        flag = f"{flag}/--no-{flag[2:]}"
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[kind, typer.Option(flag, help=help_text, rich_help_panel=panel)],
    )


def _evaluate_option(axis: Axis) -> inspect.Parameter:
    default = axis.default_for_evaluate
    if axis.kind == "mode":
        kind = type(axis.choices[0])
        choices = ", ".join(map(str, axis.choices))
        help_text = f"{axis.description} ({choices})."
        return _option(axis.layout_attr, kind, default, help_text, LAYOUT)
    kind = bool if axis.kind == "flag" else int
    return _option(axis.layout_attr, kind, default, axis.description, LAYOUT)


def axis_options(command: Literal["solve", "evaluate"]) -> list[inspect.Parameter]:
    """The layout options of ``command``: for ``solve``, a pin and a limit per searchable axis;
    for ``evaluate``, a value per given axis (``dp`` and ``grad_accum`` follow from the
    products; sequence parallelism has its own on/off flag)."""
    if command == "evaluate":
        return [_evaluate_option(axis) for axis in GIVEN_AXES]
    out = []
    for axis in AXES:
        if not axis.searchable:
            continue
        out.append(_option(axis.name, int | None, None, f"Pin {axis.title}: {axis.description}"))
        cap = f" (default {axis.cap})" if axis.cap else ""
        out.append(_option(f"max_{axis.name}", int | None, None, f"Largest {axis.title}{cap}."))
    return out


def with_axis_options(command: Literal["solve", "evaluate"]) -> Callable:
    """Give a command function, which takes ``**axis_values``, the options of ``axis_options``:
    typer reads the generated signature; the function receives the values as keywords."""
    extra = axis_options(command)
    names = [p.name for p in extra]

    def decorate(func: Callable) -> Callable:
        signature = inspect.signature(func, eval_str=True)
        params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            axis_values = {name: kwargs.pop(name) for name in names if name in kwargs}
            return func(*args, **kwargs, **axis_values)

        wrapper.__signature__ = signature.replace(parameters=[*params, *extra])
        return wrapper

    return decorate


def pins_and_limits(axis_values: dict[str, Any]) -> tuple[dict[str, int | None], dict[str, int]]:
    """``solve``'s generated options split into pins (``tp=8``) and limits (``{"pp": 16}``)."""
    pins = {k: v for k, v in axis_values.items() if not k.startswith("max_")}
    limits = {k[4:]: v for k, v in axis_values.items() if k.startswith("max_") and v is not None}
    return pins, limits
