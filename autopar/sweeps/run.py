"""``autopar.sweeps.run``: solve over a grid of GPU counts, GPU types and sequence lengths (DESIGN
§7).

Each grid point is one ``autopar.solve(..., top=1)``. A point where no layout fits is a row with
status ``infeasible`` (or ``unknown`` on a time-out) and NaN figures, never an exception; a point
whose own input is bad (a GPU file, a sequence length the batch tokens do not divide) is a row
with status ``error``; ``reason`` says why in both cases. Options all points share are checked
before any solve (a bad one is the sweep's ``InputError``).

Nothing finished is ever thrown away (issue 24): Ctrl-C (or the CLI's SIGTERM) raises
``autopar.base.errors.Interrupted`` holding a partial ``SweepResult``, in which the points not
solved are rows with status ``interrupted``; a point lost with its worker process (killed, out
of memory; tried twice) is a row with status ``failed`` and the result is ``partial`` too.
``time_limit`` covers the whole sweep and ``point_time_limit`` each point's solve; a point the
sweep's limit never reached is a row ``unknown`` and the result says ``cut_short``.
With ``train_tokens`` each row gets ``days_to_train`` (with failures: the throughput times the
layout's goodput, ``autopar.costs.goodput``) beside ``days_to_train_failure_free``; with
``gpu_hour_cost`` also ``cost`` and ``cost_failure_free`` (``gpus * hours * gpu_hour_cost``, in
``currency``). Every row carries the goodput, the checkpoint interval and the interruptions per
day; the failure model (``gpu_mtbf_hours``, ``restart_s``, ``checkpoint_gb_per_s``) and
``objective`` are options like the others. ``SweepResult.inputs`` holds what every point shares
(``autopar.sweeps.inputs``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from autopar import __version__, api
from autopar.base.axes import AXES
from autopar.base.errors import InputError, Interrupted, excerpt, one_line
from autopar.costs.plugin import load_cost_model
from autopar.inputs import limits as bounds
from autopar.inputs.specs import GIB, GpuSpec
from autopar.layout.plan import Estimate
from autopar.sweeps.dask_run import run_dask
from autopar.sweeps.inputs import DEFAULT_CURRENCY, SweepInputs, sweep_inputs
from autopar.sweeps.workers import Lost, run_pool

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
    "goodput",
    "checkpoint_interval_s",
    "interruptions_per_day",
    "days_to_train_failure_free",
    "cost_failure_free",
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
    inputs: SweepInputs | None = None
    """What every point assumed (model, GPUs and their memory, batches, precision, stack, price,
    release); None when no point had a valid problem."""
    partial: bool = False
    """Some points have no answer: the sweep was interrupted (their rows say ``interrupted``)
    or their worker died (``failed``, with the reason)."""
    partial_reason: str | None = None
    """Why, in a line: ``interrupted after 11 of 20 points``, ``1 of 20 points failed: ...``."""
    cut_short: bool = False
    """The sweep's ``time_limit`` ran out before some points (their rows say ``unknown``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "columns": list(COLUMNS),
            "rows": [row.to_dict() for row in self.rows],
            "inputs": self.inputs.to_dict() if self.inputs else None,
            "partial": self.partial,
            "partial_reason": self.partial_reason,
            "cut_short": self.cut_short,
        }

    @property
    def failed(self) -> tuple[SweepRow, ...]:
        """The rows of points lost with their worker (status ``failed``)."""
        return tuple(row for row in self.rows if row.status == FAILED)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([asdict(row) for row in self.rows], columns=list(COLUMNS))


def _items(value: Any, flag: str, what: str) -> list[Any]:
    """One value or an ordered collection of them (list, tuple, range, a 1-D numpy array or
    pandas Series); a set (no order) or a mapping is refused, saying what is expected."""
    if isinstance(value, str | bytes | GpuSpec) or not isinstance(value, Iterable):
        return [value]
    if isinstance(value, Mapping | set | frozenset):
        raise InputError(f"must be {what} or a list of them, got {excerpt(value)}", source=flag)
    items = list(value)
    if len(items) > bounds.MAX_SWEEP_POINTS:
        raise InputError(f"at most {bounds.MAX_SWEEP_POINTS} values, got {len(items)}", source=flag)
    return items


def _as_list(value: Any, name: str, kind: type, maximum: int = 0) -> list[Any]:
    flag = f"--{name.replace('_', '-')}"
    what = "a positive integer" if kind is int else "a GPU name"
    if value is None:
        raise InputError(f"is required: {what} or a list of them", source=flag)
    items = _items(value, flag, what)
    if not items:
        raise InputError("needs at least one value", source=flag)
    if kind is int:
        return [bounds.check_int(item, source=flag, maximum=maximum) for item in items]
    for item in items:
        if not isinstance(item, str | GpuSpec):
            raise InputError(f"must be GPU names, got {excerpt(item)}", source=flag)
    return items


def _gpu_name(gpu: str | GpuSpec | None, cluster: str | None) -> str:
    if isinstance(gpu, GpuSpec):
        return gpu.name
    if isinstance(gpu, str):
        return gpu
    from autopar.inputs.loading import load_cluster

    return load_cluster(gpu=None, cluster_file=cluster).gpu.name


def _row(gpus: int, gpu: str, seq_len: int, status: str, best: Estimate | None) -> SweepRow:
    if best is None:
        return SweepRow(gpus=gpus, gpu=gpu, seq_len=seq_len, status=status)
    low, high = best.step_time_range_s or (NAN, NAN)
    band = best.error_band or {}
    g = best.goodput

    def number(value: float | None) -> float:
        return NAN if value is None else value

    return SweepRow(
        gpus=gpus,
        gpu=gpu,
        seq_len=seq_len,
        status=status,
        **best.layout.to_dict(),
        step_time_s=best.step_time_s,
        step_time_low_s=low,
        step_time_high_s=high,
        error_band_pct=100.0 * band.get("rel_error", NAN),
        error_band_runs=float(band.get("num_runs", NAN)),
        tokens_per_s=best.tokens_per_s,
        tokens_per_s_per_gpu=best.tokens_per_s / gpus,
        mfu=best.mfu,
        memory_gib=best.memory_bytes["total"] / GIB,
        days_to_train=number(best.days_to_train),
        cost=number(best.cost),
        goodput=number(g.goodput if g else None),
        checkpoint_interval_s=number(g.checkpoint_interval_s if g else None),
        interruptions_per_day=number(g.interruptions_per_day if g else None),
        days_to_train_failure_free=number(best.days_to_train_failure_free),
        cost_failure_free=number(best.cost_failure_free),
    )


EXECUTORS: tuple[str, ...] = ("processes", "dask")
EXTRA_HINT = {"dask": "pip install 'autopar[dask]'", "plotly": "pip install 'autopar[html]'"}
INTERRUPTED = "interrupted"
"""Status of a point an interrupt left unsolved."""
FAILED = "failed"
"""Status of a point lost with its worker process (``reason`` says how)."""
DEFAULT_POINT_TIME_LIMIT_S = 10.0
TIME_LIMIT_REASON = "not solved: the sweep's --time-limit ran out first"


@dataclass(frozen=True, slots=True)
class _PointJob:
    """One grid point and everything a worker process needs to solve it (picklable)."""

    gpus: int
    gpu: str | GpuSpec | None
    seq_len: int
    options: dict[str, Any]
    error: str | None = None
    """This point's input error, found before any solve (the row says it; no solve)."""
    point_time_limit_s: float = DEFAULT_POINT_TIME_LIMIT_S
    deadline_unix_s: float | None = None
    """The sweep's deadline on the wall clock (``time.time()``: the same in every worker process
    and, to the clocks' skew, on a Dask cluster)."""

    @property
    def label(self) -> str:
        return self.gpu.name if isinstance(self.gpu, GpuSpec) else str(self.gpu or "default")

    def empty_row(self, status: str, reason: str) -> SweepRow:
        """The row of this point without an answer."""
        return SweepRow(
            gpus=self.gpus, gpu=self.label, seq_len=self.seq_len, status=status, reason=reason
        )


Solved = tuple[SweepRow, dict[str, float] | None]


def _solve_point(job: _PointJob) -> Solved:
    """Solve one point; module-level so that worker processes and Dask can ship it. An input
    error of this point alone is a row with status ``error`` and the reason; the other points
    go on. The solve gets ``point_time_limit_s`` or what is left of the sweep's limit."""
    limit = job.point_time_limit_s
    if job.deadline_unix_s is not None:
        limit = min(limit, job.deadline_unix_s - time.time())
        if limit <= 0:
            return job.empty_row("unknown", TIME_LIMIT_REASON), None
    try:
        if job.error is not None:
            raise InputError(job.error)
        result = api.solve(
            gpus=job.gpus, gpu=job.gpu, seq_len=job.seq_len, top=1, time_limit=limit, **job.options
        )
        name = _gpu_name(job.gpu, job.options.get("cluster"))
    except InputError as err:
        return job.empty_row("error", str(err)), None
    best = result.layouts[0] if result.layouts else None
    row = _row(job.gpus, name, job.seq_len, result.status, best)
    if best is None and result.explanation:
        row = dataclasses.replace(row, reason=one_line(result.explanation.summary))
    memory = None
    if best is not None:
        memory = {k: v / GIB for k, v in best.memory_bytes.items() if k != "total"}
    return row, memory


Progress = Callable[[int, int, SweepRow], None]


class _Collected:
    """The answers as they come, in grid order, and the progress callback."""

    def __init__(
        self, jobs: Sequence[_PointJob], progress: Progress | None, inputs: SweepInputs | None
    ) -> None:
        self.jobs, self.progress, self.inputs = jobs, progress, inputs
        self.values: list[Solved | Lost | None] = [None] * len(jobs)
        self.count = 0

    def done(self, index: int, value: Solved | Lost) -> None:
        self.values[index] = value
        self.count += 1
        if self.progress is not None:
            row = self._row(index)
            self.progress(self.count, len(self.jobs), row)

    def _row(self, index: int) -> SweepRow:
        value, job = self.values[index], self.jobs[index]
        if isinstance(value, Lost):
            return job.empty_row(FAILED, value.reason)
        if value is None:
            return job.empty_row(INTERRUPTED, "not solved: interrupted")
        return value[0]

    def result(self, interrupted: bool = False) -> SweepResult:
        rows = tuple(self._row(index) for index in range(len(self.jobs)))
        memory = tuple(v[1] if isinstance(v, tuple) else None for v in self.values)
        lost = sum(isinstance(value, Lost) for value in self.values)
        reason = None
        if interrupted:
            reason = f"interrupted after {self.count} of {len(self.jobs)} points"
        elif lost:
            first = next(v.reason for v in self.values if isinstance(v, Lost))
            reason = f"{lost} of {len(self.jobs)} points failed: {first}"
        return SweepResult(
            rows,
            memory,
            inputs=self.inputs,
            partial=reason is not None,
            partial_reason=reason,
            cut_short=any(row.reason == TIME_LIMIT_REASON for row in rows),
        )


def _run_serial(jobs: Sequence[_PointJob], done: Callable[[int, Any], None]) -> None:
    for index, job in enumerate(jobs):
        done(index, _solve_point(job))


def check_jobs(jobs: Any, executor: str) -> int:
    if not isinstance(executor, str) or executor not in EXECUTORS:
        raise InputError(
            f"must be one of {', '.join(EXECUTORS)}, got {excerpt(executor)}", source="--executor"
        )
    return bounds.check_int(jobs, source="--jobs", maximum=bounds.MAX_JOBS)


def _check_time_limits(time_limit: Any, point_time_limit: Any) -> float | None:
    """The sweep's deadline (``time.time()`` seconds) from ``time_limit``, both limits checked."""
    bounds.check_number(
        point_time_limit,
        source="--point-time-limit",
        maximum=bounds.MAX_TIME_LIMIT_S,
        inclusive=True,
    )
    if time_limit is None:
        return None
    limit = bounds.check_number(
        time_limit, source="--time-limit", maximum=bounds.MAX_TIME_LIMIT_S, inclusive=True
    )
    return time.time() + limit


def sweep(
    *,
    gpus: int | Sequence[int],
    gpu: str | GpuSpec | Sequence[str | GpuSpec] | None = None,
    seq_len: int | Sequence[int] = api.DEFAULT_SEQ_LEN,
    train_tokens: float | None = None,
    gpu_hour_cost: float | None = None,
    currency: str = DEFAULT_CURRENCY,
    progress: Progress | None = None,
    jobs: int = 1,
    executor: str = "processes",
    scheduler: str | None = None,
    time_limit: float | None = None,
    point_time_limit: float = DEFAULT_POINT_TIME_LIMIT_S,
    **options: Any,
) -> SweepResult:
    """Solve every combination of ``gpus`` x ``gpu`` x ``seq_len`` (each an item or a list,
    range or array); ``options`` go to ``autopar.solve`` (``model=...``, ...).

    ``jobs`` points are solved at once, in worker processes (``executor="processes"``) or on a
    Dask cluster (``executor="dask"``: a local one of ``jobs`` workers, or the scheduler at
    ``scheduler``); rows come back in grid order either way. With ``jobs > 1`` and no
    ``num_workers``, each solve gets ``cpu_count // jobs`` CP-SAT workers, so that the processes
    do not fight over cores. ``progress(done, total, row)`` is called as points finish.
    ``time_limit`` (seconds, default none) covers the whole sweep, ``point_time_limit`` each
    point's solve. A point lost with its worker is a ``failed`` row and the result is
    ``partial``; Ctrl-C raises ``Interrupted`` holding the partial result (module docstring).
    ``currency`` only labels ``cost`` (the unit ``gpu_hour_cost`` is given in).
    """
    if "top" in options:
        raise TypeError("sweep solves with top=1; do not pass 'top'")
    jobs = check_jobs(jobs, executor)
    deadline = _check_time_limits(time_limit, point_time_limit)
    gpus_list = _as_list(gpus, "gpus", int, bounds.MAX_GPUS)
    seq_list = _as_list(seq_len, "seq_len", int, bounds.MAX_SEQ_LEN)
    gpu_list = [None] if gpu is None else _as_list(gpu, "gpu", str)
    for value, name, maximum in (
        (train_tokens, "train_tokens", bounds.MAX_TRAIN_TOKENS),
        (gpu_hour_cost, "gpu_hour_cost", bounds.MAX_GPU_HOUR_COST),
    ):
        if value is not None:
            bounds.check_number(value, source=f"--{name.replace('_', '-')}", maximum=maximum)
            options[name] = value  # the estimates give days and cost (with and without failures)
    grid = list(itertools.product(gpu_list, seq_list, gpus_list))
    if len(grid) > bounds.MAX_SWEEP_POINTS:
        raise InputError(
            f"the grid has {len(grid)} points; at most {bounds.MAX_SWEEP_POINTS}", source="--gpus"
        )
    if not isinstance(currency, str) or not currency.strip() or len(currency) > 16:
        raise InputError(
            f"must be a short label such as USD, got {excerpt(currency)}", source="--currency"
        )
    failures, problems, cost_model = _check_points(grid, options)
    inputs = sweep_inputs(
        problems,
        gpu_counts=gpus_list,
        cost_model=cost_model,
        train_tokens=train_tokens,
        gpu_hour_cost=gpu_hour_cost,
        currency=currency.strip(),
        version=__version__,
    )
    if (jobs > 1 or executor == "dask") and options.get("num_workers") is None:
        options["num_workers"] = max(1, (os.cpu_count() or 1) // jobs)
    points = [
        _PointJob(
            num_gpus,
            gpu_type,
            seq,
            options,
            failures.get((gpu_type, seq, num_gpus)),
            point_time_limit_s=float(point_time_limit),
            deadline_unix_s=deadline,
        )
        for gpu_type, seq, num_gpus in grid
    ]
    collected = _Collected(points, progress, inputs)
    try:
        if executor == "dask":
            run_dask(points, _solve_point, workers=jobs, scheduler=scheduler, done=collected.done)
        elif jobs == 1:
            _run_serial(points, collected.done)
        else:
            run_pool(points, _solve_point, workers=jobs, done=collected.done)
    except KeyboardInterrupt as stop:  # keep the finished points
        partial = collected.result(interrupted=True)
        raise Interrupted(partial, done=collected.count, total=len(points), cause=stop) from None
    return collected.result()


def _check_points(grid: Sequence[tuple[Any, int, int]], options: dict[str, Any]):
    """Before any solve: the options all points share (an error there is the whole sweep's:
    ``InputError``), then each point's problem (an error there is that point's row). Raises the
    first error when no point is valid. Returns point -> error message, the valid points'
    problems keyed ``(gpu label as the rows name it, seq_len, gpus)``, and the cost model's
    name."""
    api.check_solve_options(top=1, time_limit=0.0, num_workers=options.get("num_workers"))
    api.check_objective(
        options.get("objective", "step-time"), options.get("pipeline_plan", "uniform")
    )
    cost_model = load_cost_model(options.get("cost_model")).name
    solve_only = ("num_workers", "cost_model", "pipeline_plan", "objective")
    shared = {k: v for k, v in options.items() if k not in solve_only}
    failures: dict[tuple[Any, int, int], InputError] = {}
    problems = {}
    for gpu_type, seq, num_gpus in grid:
        try:
            problem = api.make_problem(gpus=num_gpus, gpu=gpu_type, seq_len=seq, **shared)
        except InputError as err:
            failures[(gpu_type, seq, num_gpus)] = err
            continue
        label = gpu_type.name if isinstance(gpu_type, GpuSpec) else gpu_type
        problems[(label or problem.cluster.gpu.name, seq, num_gpus)] = problem
    if len(failures) == len(grid):
        raise next(iter(failures.values()))
    return {point: str(err) for point, err in failures.items()}, problems, cost_model
