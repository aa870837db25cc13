"""``autopar sweep``: the best layout over lists of GPU counts, GPU types and sequence lengths."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from autopar.base.errors import InputError, Interrupted, excerpt
from autopar.cli import options as o
from autopar.cli.errors import EXIT_ENVIRONMENT, guarded
from autopar.cli.failure_options import Objective, with_failure_options
from autopar.cli.help import CLUSTER, EXAMPLES, OUTPUT, SEARCH, TRAINING, GroupedCommand
from autopar.cli.output import emit, emit_partial, signals_held, to_json
from autopar.cli.render import csv_text
from autopar.inputs.problem import DEFAULT_SEQ_LEN

if TYPE_CHECKING:
    from autopar.sweeps.run import SweepResult, SweepRow
from autopar.sweeps.inputs import DEFAULT_CURRENCY

FORMATS: tuple[str, ...] = ("table", "csv", "json", "html")
SweepTimeLimit = Annotated[
    float | None,
    typer.Option(
        "--time-limit",
        help="Seconds for the whole sweep (default: none).",
        rich_help_panel=SEARCH,
    ),
]
PointTimeLimit = Annotated[
    float,
    typer.Option(
        "--point-time-limit",
        help="Solver time limit of each point in seconds.",
        rich_help_panel=SEARCH,
    ),
]


def parse_list(text: str, flag: str, kind: type = int) -> list:
    """``"256,512"`` -> ``[256, 512]``; a bad item is an ``InputError`` naming ``flag``."""
    items = [item.strip() for item in str(text).split(",")]
    if not items or any(not item for item in items):
        raise InputError(f"must be a comma-separated list, got {excerpt(text)}", source=flag)
    if kind is str:
        return items
    out = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise InputError(f"{excerpt(item)} is not an integer", source=flag) from None
        if value < 1:
            raise InputError(f"must be positive, got {value}", source=flag)
        out.append(value)
    return out


def _number(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"must be a number, got {excerpt(text)}", source=flag) from None
    if not (value > 0 and math.isfinite(value)):
        raise InputError(f"must be a positive number, got {excerpt(text)}", source=flag)
    return value


def sweep_table(result: SweepResult) -> str:
    """The sweep for people: one aligned line per grid point, the columns of the HTML report's
    table (``autopar.sweeps.report.COLUMNS``) less the free-text reason."""
    from autopar.sweeps.report import cell, shown_columns, title_values, value_of

    columns = shown_columns(result.rows, wide=False)
    values = title_values(result.inputs)
    cells = [[c.title.format(**values) for c in columns]]
    for row in result.rows:
        cells.append([cell(value_of(c.key, row), c.fmt) for c in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        " ".join(text.rjust(width) for text, width in zip(line, widths, strict=True))
        for line in cells
    )


def render_sweep(result: SweepResult, fmt: str) -> str:
    if fmt not in FORMATS:
        raise InputError(
            f"must be one of {', '.join(FORMATS)}, got {excerpt(fmt)}", source="--format"
        )
    if fmt == "json":
        return to_json(result.to_dict())
    if fmt == "csv":
        return csv_text([row.to_dict() for row in result.rows])
    if fmt == "html":
        from autopar.sweeps.html import sweep_html

        return sweep_html(result)
    table = sweep_table(result)
    if result.partial:
        table += (
            f"\npartial: {result.partial_reason} (rows 'interrupted' or 'failed' have no answer)"
        )
    return table


def _progress_line(done: int, total: int, row: SweepRow) -> None:
    figure = (
        f"{row.step_time_s:.3f} s/step, {row.tokens_per_s_per_gpu:,.0f} tok/s/GPU"
        if row.status in ("optimal", "feasible")
        else "no layout"
    )
    typer.echo(
        f"[{done}/{total}] gpus={row.gpus} gpu={row.gpu} seq_len={row.seq_len}: "
        f"{row.status}, {figure}",
        err=True,
    )


@contextlib.contextmanager
def progress_reporter(console=None) -> Iterator[Callable[[int, int, SweepRow], None]]:
    """A progress callback for ``sweep``: a rich progress bar when stderr is a terminal (or
    ``console`` is given), else one line per point (readable in CI logs)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = console or Console(stderr=True)
    if not console.is_terminal:
        yield _progress_line
        return
    columns = (TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("sweep", total=None)

        def advance(done: int, total: int, row: SweepRow) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


def _write_partial(result: SweepResult, fmt: str, output: str | None) -> None:
    """A partial sweep beside ``--output`` (``emit_partial``) and one line saying why and where;
    a second Ctrl-C or SIGTERM waits until both are done (``signals_held``)."""
    text = render_sweep(result, fmt)
    with signals_held(output):
        where = emit_partial(text, output)
        kept = (
            "the finished points are on stdout, marked partial"
            if where == "stdout"
            else f"the finished points are in {where} (marked partial; --output is left as it was)"
        )
        typer.echo(f"autopar: sweep {result.partial_reason}; {kept}", err=True)


def register(app: typer.Typer) -> None:
    @app.command("sweep", cls=GroupedCommand, epilog=EXAMPLES["sweep"])
    @guarded
    @with_failure_options(run=False)
    @o.with_stack_options
    def sweep_command(
        model: o.Model,
        gpus: Annotated[
            str,
            typer.Option(
                "--gpus",
                "-n",
                help="GPU counts, comma-separated: 256,512,1024.",
                rich_help_panel=CLUSTER,
            ),
        ],
        gpu: Annotated[
            str | None,
            typer.Option(
                "--gpu",
                help="GPU presets, comma-separated: h100,h200 (default h100).",
                rich_help_panel=CLUSTER,
            ),
        ] = None,
        gpus_per_node: o.GpusPerNode = None,
        cluster: o.Cluster = None,
        comm_profile: o.CommProfile = None,
        global_batch: o.GlobalBatch = None,
        global_batch_tokens: o.GlobalBatchTokens = None,
        seq_len: Annotated[
            str,
            typer.Option(
                "--seq-len",
                help="Sequence lengths, comma-separated: 4096,8192.",
                rich_help_panel=TRAINING,
            ),
        ] = str(DEFAULT_SEQ_LEN),
        precision: o.Precision = "bf16",
        framework: o.Framework = "megatron",
        stack_options: dict | None = None,
        failure_options: dict | None = None,
        cost_model: o.CostModelOpt = None,
        objective: Objective = "step-time",
        uneven_pipeline: o.UnevenPipeline = True,
        pipeline_plan: o.PipelinePlan = "uniform",
        train_tokens: Annotated[
            str | None,
            typer.Option(
                "--train-tokens",
                help="Tokens to train on (15e12): adds days_to_train.",
                rich_help_panel=TRAINING,
            ),
        ] = None,
        gpu_hour_cost: Annotated[
            str | None,
            typer.Option(
                "--gpu-hour-cost",
                help="Price of one GPU-hour, in --currency: adds cost (with --train-tokens).",
                rich_help_panel=CLUSTER,
            ),
        ] = None,
        currency: Annotated[
            str,
            typer.Option(
                "--currency",
                help="What --gpu-hour-cost is priced in (a label: USD, EUR, ...).",
                rich_help_panel=CLUSTER,
            ),
        ] = DEFAULT_CURRENCY,
        time_limit: SweepTimeLimit = None,
        point_time_limit: PointTimeLimit = 10.0,
        num_workers: Annotated[
            int | None, typer.Option(help="CP-SAT workers.", rich_help_panel=SEARCH)
        ] = None,
        jobs: Annotated[
            int,
            typer.Option(
                "--jobs", "-j", help="Points solved at once (processes).", rich_help_panel=SEARCH
            ),
        ] = 1,
        executor: Annotated[
            str,
            typer.Option(
                help="processes (this machine) or dask (needs autopar[dask]).",
                rich_help_panel=SEARCH,
            ),
        ] = "processes",
        scheduler: Annotated[
            str | None,
            typer.Option(
                help="Dask scheduler address (default: a local cluster of --jobs).",
                rich_help_panel=SEARCH,
            ),
        ] = None,
        format: Annotated[
            str,
            typer.Option(
                "--format",
                "-f",
                help="table, csv, json or html (needs autopar[html]).",
                rich_help_panel=OUTPUT,
            ),
        ] = "table",
        output: o.Output = None,
    ) -> None:
        """The best layout at each GPU count, GPU type and sequence length; time and cost."""
        from autopar.sweeps.run import check_jobs, sweep

        if format not in FORMATS:
            raise InputError(
                f"must be one of {', '.join(FORMATS)}, got {excerpt(format)}", source="--format"
            )
        check_jobs(jobs, executor)
        gpus_list = parse_list(gpus, "--gpus")
        seq_list = parse_list(seq_len, "--seq-len")
        gpu_list = None if gpu is None else parse_list(gpu, "--gpu", str)
        tokens = _number(train_tokens, "--train-tokens")
        price = _number(gpu_hour_cost, "--gpu-hour-cost")
        common = o.common(locals(), skip=("gpus", "gpu", "seq_len"))
        if format == "html":
            from autopar.sweeps.html import require_plotly

            require_plotly()  # a missing extra fails before the solves, not after
        try:
            with progress_reporter() as progress:
                result = sweep(
                    gpus=gpus_list,
                    gpu=gpu_list,
                    seq_len=seq_list,
                    train_tokens=tokens,
                    gpu_hour_cost=price,
                    currency=currency,
                    progress=progress,
                    jobs=jobs,
                    executor=executor,
                    scheduler=scheduler,
                    time_limit=time_limit,
                    point_time_limit=point_time_limit,
                    num_workers=num_workers,
                    cost_model=cost_model,
                    objective=objective,
                    uneven_pipeline=uneven_pipeline,
                    pipeline_plan=pipeline_plan,
                    **common,
                )
        except Interrupted as stop:  # Ctrl-C: keep the finished points, then exit 130
            _write_partial(stop.partial, format, output)
            raise stop.cause from None
        if result.partial:  # points lost with their worker: the rest is kept, exit 4
            _write_partial(result, format, output)
            raise typer.Exit(EXIT_ENVIRONMENT)
        emit(render_sweep(result, format), output)
