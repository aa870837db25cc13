"""``autopar.sweeps.run``: solve over a grid of GPU counts, GPU types and sequence lengths (DESIGN
§7).

Each grid point is one ``autopar.solve(..., top=1)``. A point where no layout fits is a row with
status ``infeasible`` (or ``unknown`` on a time-out) and NaN figures, never an exception; a point
whose own input is bad (a GPU file, a sequence length the batch tokens do not divide) is a row
with status ``error``; ``reason`` says why in both cases. Options all points share are checked
before any solve (a bad one is the sweep's ``InputError``). Ctrl-C raises
``autopar.base.errors.Interrupted`` holding the finished rows.
With ``train_tokens`` each row gets ``days_to_train``; with ``gpu_hour_cost`` also ``cost``
(``gpus * hours * gpu_hour_cost``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from autopar import api
from autopar.base.axes import AXES
from autopar.base.errors import InputError, Interrupted, excerpt, one_line
from autopar.costs.plugin import load_cost_model
from autopar.inputs import limits as bounds
from autopar.inputs.specs import GIB, GpuSpec
from autopar.layout.plan import Estimate

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_HOUR = 3_600.0

NAN = float("nan")


class _SweepRowMethods:
    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN and infinities become ``None``."""
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in asdict(self).items()
        }


_POINT_FIELDS = [("gpus", int), ("gpu", str), ("seq_len", int), ("status", str)]
_FIGURE_FIELDS = (
    "step_time_s",
    "step_time_low_s",
    "step_time_high_s",
    "error_band_pct",
    "error_band_runs",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "memory_gib",
    "days_to_train",
    "cost",
)
SweepRow = dataclasses.make_dataclass(
    "SweepRow",
    [
        *_POINT_FIELDS,
        # One column per layout axis (``autopar.base.axes.AXES``): sizes as floats (NaN when no
        # layout was found), modes and flags as their value (None then).
        *(
            (axis.layout_attr, float, dataclasses.field(default=NAN))
            if axis.kind == "size"
            else (axis.layout_attr, object, dataclasses.field(default=None))
            for axis in AXES
        ),
        *((name, float, dataclasses.field(default=NAN)) for name in _FIGURE_FIELDS),
        # Why the point has no layout: the infeasibility summary, or the input error.
        ("reason", object, dataclasses.field(default=None)),
    ],
    bases=(_SweepRowMethods,),
    frozen=True,
    slots=True,
    kw_only=True,
)
SweepRow.__module__ = __name__  # make_dataclass takes module= only from Python 3.12
SweepRow.__doc__ = """One grid point: its inputs, the solver status, the best layout (one column per
axis) and its figures (NaN when no layout was found). ``step_time_low_s`` / ``step_time_high_s``
bound the step time by the error band of the prediction's class (``error_band_pct``, drawn from
``error_band_runs`` published runs of the class; ``autopar.costs.error_bands``)."""


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(SweepRow))


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What ``autopar.sweeps.run`` returns: one row per grid point, in grid order
    (gpu, then seq_len, then gpus)."""

    rows: tuple[SweepRow, ...]
    memory_gib: tuple[dict[str, float] | None, ...] = ()
    """Per row, the best layout's per-GPU memory by part (weights, gradients, optimizer,
    activations, other) in GiB; None where no layout was found."""

    def to_dict(self) -> dict[str, Any]:
        return {"columns": list(COLUMNS), "rows": [row.to_dict() for row in self.rows]}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([asdict(row) for row in self.rows], columns=list(COLUMNS))


def _as_list(value: Any, name: str, kind: type, maximum: int = 0) -> list[Any]:
    flag = f"--{name.replace('_', '-')}"
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise InputError("needs at least one value", source=flag)
    if len(items) > bounds.MAX_SWEEP_POINTS:
        raise InputError(f"at most {bounds.MAX_SWEEP_POINTS} values, got {len(items)}", source=flag)
    for item in items:
        if kind is int:
            bounds.check_int(item, source=flag, maximum=maximum)
        elif not isinstance(item, (str, GpuSpec)):
            raise InputError(f"must be GPU names, got {excerpt(item)}", source=flag)
    return items


def _gpu_name(gpu: str | GpuSpec | None, cluster: str | None) -> str:
    if isinstance(gpu, GpuSpec):
        return gpu.name
    if isinstance(gpu, str):
        return gpu
    from autopar.inputs.loading import load_cluster

    return load_cluster(gpu=None, cluster_file=cluster).gpu.name


def _row(
    gpus: int,
    gpu: str,
    seq_len: int,
    status: str,
    best: Estimate | None,
    train_tokens: float | None,
    gpu_hour_cost: float | None,
) -> SweepRow:
    if best is None:
        return SweepRow(gpus=gpus, gpu=gpu, seq_len=seq_len, status=status)
    lay = best.layout
    days = cost = NAN
    if train_tokens is not None and best.tokens_per_s > 0:
        seconds = train_tokens / best.tokens_per_s
        days = seconds / SECONDS_PER_DAY
        if gpu_hour_cost is not None:
            cost = gpus * seconds / SECONDS_PER_HOUR * gpu_hour_cost
    low, high = best.step_time_range_s or (NAN, NAN)
    band = best.error_band or {}
    return SweepRow(
        gpus=gpus,
        gpu=gpu,
        seq_len=seq_len,
        status=status,
        **lay.to_dict(),
        step_time_s=best.step_time_s,
        step_time_low_s=low,
        step_time_high_s=high,
        error_band_pct=100.0 * band.get("rel_error", NAN),
        error_band_runs=float(band.get("num_runs", NAN)),
        tokens_per_s=best.tokens_per_s,
        tokens_per_s_per_gpu=best.tokens_per_s / gpus,
        mfu=best.mfu,
        memory_gib=best.memory_bytes["total"] / GIB,
        days_to_train=days,
        cost=cost,
    )


EXECUTORS: tuple[str, ...] = ("processes", "dask")
EXTRA_HINT = {"dask": "pip install 'autopar[dask]'", "plotly": "pip install 'autopar[html]'"}


@dataclass(frozen=True, slots=True)
class _PointJob:
    """One grid point and everything a worker process needs to solve it (picklable)."""

    gpus: int
    gpu: str | GpuSpec | None
    seq_len: int
    options: dict[str, Any]
    train_tokens: float | None
    gpu_hour_cost: float | None
    error: str | None = None
    """This point's input error, found before any solve (the row says it; no solve)."""


Solved = tuple[SweepRow, dict[str, float] | None]


def _solve_point(job: _PointJob) -> Solved:
    """Solve one point; module-level so that process pools and Dask can ship it. An input
    error of this point alone is a row with status ``error`` and the reason; the other points
    go on."""
    try:
        if job.error is not None:
            raise InputError(job.error)
        result = api.solve(gpus=job.gpus, gpu=job.gpu, seq_len=job.seq_len, top=1, **job.options)
        name = _gpu_name(job.gpu, job.options.get("cluster"))
    except InputError as err:
        label = job.gpu.name if isinstance(job.gpu, GpuSpec) else str(job.gpu or "default")
        row = SweepRow(gpus=job.gpus, gpu=label, seq_len=job.seq_len, status="error")
        return dataclasses.replace(row, reason=str(err)), None
    best = result.layouts[0] if result.layouts else None
    row = _row(
        job.gpus, name, job.seq_len, result.status, best, job.train_tokens, job.gpu_hour_cost
    )
    if best is None and result.explanation:
        row = dataclasses.replace(row, reason=one_line(result.explanation.summary))
    memory = None
    if best is not None:
        memory = {k: v / GIB for k, v in best.memory_bytes.items() if k != "total"}
    return row, memory


Progress = Callable[[int, int, SweepRow], None]


def _run_serial(jobs: list[_PointJob], progress: Progress | None) -> list[Solved]:
    rows: list[Solved] = []
    try:
        for done, job in enumerate(jobs, 1):
            rows.append(_solve_point(job))
            if progress is not None:
                progress(done, len(jobs), rows[-1][0])
    except KeyboardInterrupt as stop:  # keep the finished points
        raise _interrupted(rows, len(jobs), stop) from None
    return rows


def _interrupted(rows: Sequence[Solved | None], total: int, stop: BaseException) -> Interrupted:
    done = [solved for solved in rows if solved is not None]
    partial = SweepResult(tuple(r for r, _ in done), tuple(m for _, m in done))
    return Interrupted(partial, done=len(done), total=total, cause=stop)


def _run_processes(jobs: list[_PointJob], workers: int, progress: Progress | None):
    from concurrent.futures import ProcessPoolExecutor, as_completed

    rows: list[Solved | None] = [None] * len(jobs)
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        futures = {pool.submit(_solve_point, job): i for i, job in enumerate(jobs)}
        try:
            for done, future in enumerate(as_completed(futures), 1):
                rows[futures[future]] = solved = future.result()
                if progress is not None:
                    progress(done, len(jobs), solved[0])
        except KeyboardInterrupt as stop:  # keep the finished points, drop the queued ones
            pool.shutdown(wait=False, cancel_futures=True)
            raise _interrupted(rows, len(jobs), stop) from None
    return rows


def _run_dask(jobs: list[_PointJob], workers: int, scheduler: str | None, progress):
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise InputError(f"needs Dask: {EXTRA_HINT['dask']}", source="--executor dask") from None
    cluster = None
    if scheduler is None:
        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
    client = Client(cluster if cluster is not None else scheduler)
    try:
        futures = client.map(_solve_point, jobs, pure=False)
        index = {future.key: i for i, future in enumerate(futures)}
        rows: list[Solved | None] = [None] * len(jobs)
        for done, future in enumerate(as_completed(futures), 1):
            rows[index[future.key]] = solved = future.result()
            if progress is not None:
                progress(done, len(jobs), solved[0])
        return rows
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def check_jobs(jobs: Any, executor: str) -> None:
    bounds.check_int(jobs, source="--jobs", maximum=bounds.MAX_JOBS)
    if not isinstance(executor, str) or executor not in EXECUTORS:
        raise InputError(
            f"must be one of {', '.join(EXECUTORS)}, got {excerpt(executor)}", source="--executor"
        )


def sweep(
    *,
    gpus: int | Sequence[int],
    gpu: str | GpuSpec | Sequence[str | GpuSpec] | None = None,
    seq_len: int | Sequence[int] = api.DEFAULT_SEQ_LEN,
    train_tokens: float | None = None,
    gpu_hour_cost: float | None = None,
    progress: Progress | None = None,
    jobs: int = 1,
    executor: str = "processes",
    scheduler: str | None = None,
    **options: Any,
) -> SweepResult:
    """Solve every combination of ``gpus`` x ``gpu`` x ``seq_len`` (each an item or a list);
    ``options`` go to ``autopar.solve`` (``model=...``, ``global_batch_tokens=...``, ...).

    ``jobs`` points are solved at once, in worker processes (``executor="processes"``) or on a
    Dask cluster (``executor="dask"``: a local one of ``jobs`` workers, or the scheduler at
    ``scheduler``); rows come back in grid order either way. With ``jobs > 1`` and no
    ``num_workers``, each solve gets ``cpu_count // jobs`` CP-SAT workers, so that the processes
    do not fight over cores. ``progress(done, total, row)`` is called as points finish.
    """
    if "top" in options:
        raise TypeError("sweep solves with top=1; do not pass 'top'")
    check_jobs(jobs, executor)
    gpus_list = _as_list(gpus, "gpus", int, bounds.MAX_GPUS)
    seq_list = _as_list(seq_len, "seq_len", int, bounds.MAX_SEQ_LEN)
    gpu_list = [None] if gpu is None else _as_list(gpu, "gpu", str)
    for value, name, maximum in (
        (train_tokens, "train_tokens", bounds.MAX_TRAIN_TOKENS),
        (gpu_hour_cost, "gpu_hour_cost", bounds.MAX_GPU_HOUR_COST),
    ):
        if value is not None:
            bounds.check_number(value, source=f"--{name.replace('_', '-')}", maximum=maximum)
    grid = list(itertools.product(gpu_list, seq_list, gpus_list))
    if len(grid) > bounds.MAX_SWEEP_POINTS:
        raise InputError(
            f"the grid has {len(grid)} points; at most {bounds.MAX_SWEEP_POINTS}", source="--gpus"
        )
    failures = _check_points(grid, options)
    if (jobs > 1 or executor == "dask") and options.get("num_workers") is None:
        options["num_workers"] = max(1, (os.cpu_count() or 1) // jobs)
    points = [
        _PointJob(
            num_gpus,
            gpu_type,
            seq,
            options,
            train_tokens,
            gpu_hour_cost,
            failures.get((gpu_type, seq, num_gpus)),
        )
        for gpu_type, seq, num_gpus in grid
    ]
    if executor == "dask":
        rows = _run_dask(points, jobs, scheduler, progress)
    elif jobs == 1:
        rows = _run_serial(points, progress)
    else:
        rows = _run_processes(points, jobs, progress)
    return SweepResult(tuple(r for r, _ in rows), tuple(m for _, m in rows))


def _check_points(grid: Sequence[tuple[Any, int, int]], options: dict[str, Any]) -> dict:
    """Before any solve: the options all points share (an error there is the whole sweep's:
    ``InputError``), then each point's problem (an error there is that point's row). Raises the
    first error when no point is valid. Returns point -> error message."""
    api.check_solve_options(
        top=1, time_limit=options.get("time_limit", 10.0), num_workers=options.get("num_workers")
    )
    load_cost_model(options.get("cost_model"))
    solve_only = ("time_limit", "num_workers", "cost_model", "pipeline_plan")
    shared = {k: v for k, v in options.items() if k not in solve_only}
    failures: dict[tuple[Any, int, int], InputError] = {}
    for gpu_type, seq, num_gpus in grid:
        try:
            api.make_problem(gpus=num_gpus, gpu=gpu_type, seq_len=seq, **shared)
        except InputError as err:
            failures[(gpu_type, seq, num_gpus)] = err
    if len(failures) == len(grid):
        raise next(iter(failures.values()))
    return {point: str(err) for point, err in failures.items()}
