"""``autopar sweep``: the best layout over lists of GPU counts, GPU types and sequence lengths."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated

import typer

from autopar.base.axes import AXES
from autopar.base.errors import InputError, Interrupted, excerpt
from autopar.cli import options as o
from autopar.cli.errors import guarded
from autopar.cli.output import emit, to_json
from autopar.cli.render import csv_text
from autopar.inputs.problem import DEFAULT_SEQ_LEN

if TYPE_CHECKING:
    from autopar.sweeps.run import SweepResult, SweepRow

FORMATS: tuple[str, ...] = ("table", "csv", "json", "html")


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


def _cell(value: object, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return format(value, fmt)
    return str(value)


_TABLE = (
    # column, header, float format
    ("gpus", "GPUs", ""),
    ("gpu", "GPU", ""),
    ("seq_len", "seq", ""),
    ("status", "status", ""),
    *((axis.layout_attr, axis.title, ".0f") for axis in AXES),
    ("step_time_s", "step s", ".3f"),
    ("error_band_pct", "±%", ".0f"),
    ("tokens_per_s_per_gpu", "tok/s/GPU", ",.0f"),
    ("mfu", "MFU", ".1%"),
    ("memory_gib", "GiB", ".1f"),
    ("days_to_train", "days", ".1f"),
    ("cost", "cost", ",.0f"),
)


def sweep_table(result: SweepResult) -> str:
    """The sweep for people: one aligned line per grid point."""
    cells = [[header for _, header, _ in _TABLE]]
    for row in result.rows:
        cells.append([_cell(getattr(row, name), fmt) for name, _, fmt in _TABLE])
    widths = [max(len(line[i]) for line in cells) for i in range(len(_TABLE))]
    return "\n".join(
        " ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
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
    return sweep_table(result)


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


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    @guarded
    @o.with_stack_options
    def sweep_command(
        model: o.Model,
        gpus: Annotated[
            str, typer.Option("--gpus", "-n", help="GPU counts, comma-separated: 256,512,1024.")
        ],
        gpu: Annotated[
            str | None,
            typer.Option("--gpu", help="GPU presets, comma-separated: h100,h200 (default h100)."),
        ] = None,
        gpus_per_node: o.GpusPerNode = None,
        cluster: o.Cluster = None,
        comm_profile: o.CommProfile = None,
        global_batch: o.GlobalBatch = None,
        global_batch_tokens: o.GlobalBatchTokens = None,
        seq_len: Annotated[
            str, typer.Option("--seq-len", help="Sequence lengths, comma-separated: 4096,8192.")
        ] = str(DEFAULT_SEQ_LEN),
        precision: o.Precision = "bf16",
        framework: o.Framework = "megatron",
        stack_options: dict | None = None,
        cost_model: o.CostModelOpt = None,
        uneven_pipeline: o.UnevenPipeline = False,
        pipeline_plan: o.PipelinePlan = "uniform",
        train_tokens: Annotated[
            str | None,
            typer.Option("--train-tokens", help="Tokens to train on (15e12): adds days_to_train."),
        ] = None,
        gpu_hour_cost: Annotated[
            str | None,
            typer.Option("--gpu-hour-cost", help="Price of one GPU-hour: adds cost."),
        ] = None,
        time_limit: Annotated[
            float, typer.Option(help="Solver time limit per point in seconds.")
        ] = 10.0,
        num_workers: Annotated[int | None, typer.Option(help="CP-SAT workers.")] = None,
        jobs: Annotated[
            int, typer.Option("--jobs", "-j", help="Points solved at once (processes).")
        ] = 1,
        executor: Annotated[
            str,
            typer.Option(help="processes (this machine) or dask (needs autopar[dask])."),
        ] = "processes",
        scheduler: Annotated[
            str | None,
            typer.Option(help="Dask scheduler address (default: a local cluster of --jobs)."),
        ] = None,
        format: Annotated[
            str,
            typer.Option("--format", "-f", help="table, csv, json or html (needs autopar[html])."),
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
                    progress=progress,
                    jobs=jobs,
                    executor=executor,
                    scheduler=scheduler,
                    time_limit=time_limit,
                    num_workers=num_workers,
                    cost_model=cost_model,
                    uneven_pipeline=uneven_pipeline,
                    pipeline_plan=pipeline_plan,
                    **common,
                )
        except Interrupted as stop:  # Ctrl-C: keep the finished points, then exit 130
            emit(render_sweep(stop.partial, format), output)
            typer.echo(f"autopar: sweep {stop} points", err=True)
            raise stop.cause from None
        emit(render_sweep(result, format), output)
