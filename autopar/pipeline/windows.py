"""Per-stage window tables for pipelines without interleaving (``vpp == 1``) and any layer kinds:
for every outer row, every start layer ``s`` and layer count ``n`` a stage may hold, the least
time of one micro-batch on the stage holding layers ``[s, s+n)`` over its recompute choices
(none, selective, ``full:k`` for its first ``k`` layers) among those that fit its memory
(``inf`` when none fits).

With ``vpp == 1`` a stage is one chunk of consecutive layers, so its time and memory depend only
on that window and its recompute (``autopar.costs.stage_figures.stage_figures``): the best plan for
given stage boundaries takes each stage's entry of these tables, and the plan search reduces to the
boundaries. Starts whose remaining layers read the same kinds
(``start_classes``: every start after DeepSeek-V3's three dense layers, say) share one row of
the table, which keeps it small: ``classes x (L+1)`` entries per stage and outer row.
``WindowEncoding`` is the search over those boundaries.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from autopar.costs.stage_costs import StageCosts
from autopar.layout.stages import StagePlan, StageRecompute
from autopar.pipeline.encoding import (
    Bounds,
    Fix,
    PlanContext,
    RowLink,
    Shape,
    TableBatch,
    TableHandle,
    least_layers,
    ns,
)


@dataclass(frozen=True, slots=True)
class WindowTable:
    """One stage over ``rows`` outer rows, start classes and ``0..L`` layers."""

    time_s: np.ndarray
    """``(rows, classes, L+1)``: least time, ``inf`` where nothing fits."""
    option: np.ndarray
    """``(rows, classes, L+1)``: 0 none, 1 selective, ``1 + k`` full for the first ``k`` layers."""

    def recompute(self, row: int, start_class: int, n: int) -> StageRecompute:
        code = int(self.option[row, start_class, n])
        if code == 1:
            return StageRecompute("selective", 0)
        return StageRecompute("full", code - 1) if code > 1 else StageRecompute()


def start_classes(kinds: Sequence[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(class of every start ``0..L``, the first start of each class). Start ``s`` joins the
    class of the first ``s' <= s`` whose layers read like those from ``s`` for the ``L - s``
    layers left: every window from ``s`` then has the kinds of the window from ``s'``."""
    num_layers = len(kinds)
    reps: list[int] = []
    out = []
    for s in range(num_layers + 1):
        rest = tuple(kinds[s:])
        for j, r in enumerate(reps):
            if tuple(kinds[r : r + len(rest)]) == rest:
                out.append(j)
                break
        else:
            out.append(len(reps))
            reps.append(s)
    return tuple(out), tuple(reps)


def _prefix(costs: StageCosts, kinds: Sequence[str], name: str, code: int | None) -> np.ndarray:
    """``(rows, len(kinds)+1)`` prefix sums of a per-layer cost over ``kinds``."""
    table = getattr(costs, name)
    columns = [table[k][:, code] if code is not None else table[k] for k in kinds]
    rows = len(costs.every_time_s)
    values = np.stack(columns, axis=1) if columns else np.zeros((rows, 0))
    return np.concatenate([np.zeros((rows, 1)), np.cumsum(values, axis=1)], axis=1)


def window_table(
    costs: StageCosts,
    *,
    shape: Shape,
    stage: int,
    num_microbatches: np.ndarray,
    modes: tuple[str, ...],
    capacity_bytes: float,
    starts: Sequence[int],
) -> WindowTable:
    """The table of ``stage`` of a pipeline of ``shape`` (one chunk per stage) over the rows of
    ``costs``, for the windows from each start in ``starts`` (``start_classes``)."""
    kinds_all = costs.layer_kinds
    num_layers = len(kinds_all)
    rows = len(num_microbatches)
    p = shape.pp
    flights = [shape.schedule.in_flight(p, 1, int(m), stage)[0] for m in num_microbatches]
    w = np.array(flights, dtype=float)
    fixed_t = costs.every_time_s.copy()
    static = costs.every_static_bytes.copy()
    extra_act = costs.every_activation_bytes.copy()
    if stage == 0:
        fixed_t = fixed_t + costs.first_time_s
        static = static + costs.first_static_bytes
        extra_act = extra_act + costs.first_activation_bytes
    if stage == p - 1:
        fixed_t = fixed_t + costs.last_time_s
        static = static + costs.last_static_bytes
        extra_act = extra_act + costs.last_activation_bytes
    time_s = np.full((rows, len(starts), num_layers + 1), np.inf)
    option = np.zeros((rows, len(starts), num_layers + 1), dtype=np.int64)
    col = (slice(None), None)
    for c, s in enumerate(starts):
        seq = kinds_all[s:]
        width = len(seq) + 1
        t = [_prefix(costs, seq, "time_s", code) for code in range(3)]
        a = [_prefix(costs, seq, "activation_bytes", code) for code in range(3)]
        held = _prefix(costs, seq, "static_bytes", None) + static[col]
        base_act = extra_act[col] + a[0]
        choices = []  # (time, memory, code) over (rows, n)
        if "none" in modes:
            choices.append((fixed_t[col] + t[0], held + w[col] * base_act, 0))
        if "selective" in modes:
            memory = held + costs.selective_workspace_bytes[col] + w[col] * (extra_act[col] + a[1])
            choices.append((fixed_t[col] + t[1], memory, 1))
        best_t = np.full((rows, width), np.inf)
        best_o = np.zeros((rows, width), dtype=np.int64)
        for time_n, memory, code in choices:
            take = (memory <= capacity_bytes) & (time_n < best_t)
            best_t = np.where(take, time_n, best_t)
            best_o = np.where(take, code, best_o)
        if "full" in modes:
            # full:k on a window of n layers, k in 1..n: (rows, n, k)
            k = np.arange(width)
            allowed = (k[None, :] >= 1) & (k[None, :] <= k[:, None])
            if "none" not in modes:
                allowed &= k[None, :] == k[:, None]
            time_nk = (fixed_t[col] + t[0])[:, :, None] + (t[2] - t[0])[:, None, :]
            saved = (a[0] - a[2])[:, None, :]
            memory = (held + costs.full_workspace_bytes[col] + w[col] * base_act)[:, :, None] - (
                w[:, None, None] * saved
            )
            time_nk = np.where(allowed[None] & (memory <= capacity_bytes), time_nk, np.inf)
            pick = np.argmin(time_nk, axis=2)
            chosen = np.take_along_axis(time_nk, pick[:, :, None], axis=2)[:, :, 0]
            take = chosen < best_t
            best_t = np.where(take, chosen, best_t)
            best_o = np.where(take, 1 + pick, best_o)
        time_s[:, c, :width] = best_t
        option[:, c, :width] = best_o
    return WindowTable(time_s, option)


def _start_by_count(table: WindowTable, class_of: Sequence[int], least: int) -> np.ndarray:
    """``(rows, s, e)``: the stage's time holding layers ``[s, e)`` (``inf`` where ``e - s`` is
    below ``least`` or negative)."""
    num_layers = len(class_of) - 1
    size = num_layers + 1
    s = np.arange(size)[:, None]
    e = np.arange(size)[None, :]
    n = e - s
    ok = n >= max(least, 0)
    by_start = table.time_s[:, list(class_of), :]  # (rows, s, n)
    out = np.take_along_axis(by_start, np.where(ok, n, 0)[None].repeat(len(by_start), 0), axis=2)
    return np.where(ok[None], out, np.inf)


def window_bounds(
    tables: Sequence[WindowTable],
    class_of: Sequence[int],
    least: Sequence[int],
    num_microbatches: np.ndarray,
    shape: Shape,
) -> tuple[np.ndarray, np.ndarray, list[list[int] | None]]:
    """Per row, exact dynamic programmes over the stage boundaries (``p`` stages, ``L`` layers):

    - ``tau``: the least bottleneck ``max_i T_i`` over all boundaries (a linear partition);
    - the least ``sum_i T_i`` over all boundaries, and the least ``sum_i T_i`` with every
      ``T_i <= tau`` with its boundaries.

    Returns the pipeline part of a lower bound, the schedule's closed form at ``tau`` and the
    least sum (1F1B: ``(m - 1) * tau + least sum``; the step ``(m - 1) * max_i T_i + sum_i T_i``
    of any plan is at least that, the form being non-decreasing in both), the pipeline part of
    the plan found, and its boundaries (``None`` where nothing fits)."""
    grids = [_start_by_count(t, class_of, k) for t, k in zip(tables, least, strict=True)]
    rows, size = grids[0].shape[0], grids[0].shape[1]
    first = np.full((rows, size), np.inf)
    first[:, 0] = 0.0

    def chain(combine, limit):
        value, moves = first, []
        for g in grids:
            g = g if limit is None else np.where(g <= limit[:, None, None], g, np.inf)
            total = combine(value[:, :, None], g)  # (rows, s, e)
            moves.append(np.argmin(total, axis=1))
            value = np.min(total, axis=1)
        return value[:, -1], moves

    tau, _ = chain(np.maximum, None)
    least_sum, _ = chain(np.add, None)
    slack = tau * (1 + 1e-12)
    plan_sum, moves = chain(np.add, slack)
    m = np.asarray(num_microbatches, dtype=np.float64)

    def pipeline(slowest, total):
        with np.errstate(invalid="ignore"):  # 0 * inf where m == 1 and nothing fits
            return shape.schedule.pipeline_s(slowest, total, m, pp=shape.pp, vpp=1)

    lower = pipeline(tau, least_sum)
    bounds: list[list[int] | None] = []
    plan_max = np.full(rows, np.inf)
    for r in range(rows):
        if not np.isfinite(plan_sum[r]):
            bounds.append(None)
            continue
        points = [size - 1]
        for move in reversed(moves):
            points.append(int(move[r, points[-1]]))
        points.reverse()
        bounds.append(points)
        plan_max[r] = max(grids[i][r, a, b] for i, (a, b) in enumerate(itertools.pairwise(points)))
    upper = np.where(np.isfinite(plan_sum), pipeline(plan_max, plan_sum), np.inf)
    return np.where(np.isfinite(tau), lower, np.inf), upper, bounds


@dataclass(frozen=True, slots=True)
class WindowEncoding:
    """Several layer kinds, one chunk per stage: the plan is the first layer of every stage;
    each stage's time is its window table's entry (module docstring)."""

    shape: Shape
    class_of: tuple[int, ...]
    """Start class of every start layer ``0..L`` (``start_classes``)."""
    starts: tuple[int, ...]
    batches: tuple[TableBatch, ...] = ()

    @classmethod
    def of(cls, shape: Shape, kinds: Sequence[str]) -> WindowEncoding:
        class_of, starts = start_classes(kinds)
        return cls(shape, class_of, starts)

    def tighten(
        self, bounds: Bounds, rows: np.ndarray, ctx: PlanContext
    ) -> tuple[WindowEncoding, Bounds]:
        """Window tables for ``rows``, an exact bound on the bottleneck and the best plan under
        it (``window_bounds``)."""
        p, sub, m = self.shape.pp, ctx.costs.take(rows), ctx.microbatches(rows)
        tables = tuple(
            window_table(
                sub, shape=self.shape, stage=i, num_microbatches=m, modes=ctx.modes,
                capacity_bytes=ctx.capacity_bytes, starts=self.starts,
            )
            for i in range(p)
        )  # fmt: skip
        batch = TableBatch(rows, tables)
        least = [least_layers(p, 1, i, len(self.class_of) - 1) for i in range(p)]
        bound, steps, plan_bounds = window_bounds(tables, self.class_of, least, m, self.shape)
        tightened = bounds.tightened(
            rows,
            sub.step_time_s + bound,
            sub.step_time_s + steps,
            lambda j: self._plan(batch, j, plan_bounds[j]),
        )
        return dataclasses.replace(self, batches=(*self.batches, batch)), tightened

    def add(self, model: cp_model.CpModel, rows: np.ndarray, link: RowLink) -> TableHandle:
        """Stage ``i`` holds layers ``[b_i, b_{i+1})``; its time is its table's entry for the
        chosen row, the class of ``b_i`` and ``b_{i+1} - b_i`` (an allowed-assignments table
        over (row, class, n_i, T_i)); the bottleneck by ``add_max_equality``; the objective per
        row under its boolean."""
        p, num_layers, name = self.shape.pp, link.ctx.num_layers, f"pp{self.shape.pp}w"
        row_var, where = link.table_row(model, name, rows, self.batches)
        b = [model.new_constant(0)]
        b += [model.new_int_var(0, num_layers, f"{name}.b{i}") for i in range(1, p)]
        b.append(model.new_constant(num_layers))
        classes = max(self.class_of) + 1
        times = [model.new_int_var(0, link.max_ns, f"{name}.T{i}") for i in range(p)]
        for i in range(p):
            n_i = model.new_int_var(least_layers(p, 1, i, num_layers), num_layers, f"{name}.n{i}")
            model.add(n_i == b[i + 1] - b[i])
            c_i = model.new_int_var(0, classes - 1, f"{name}.c{i}")
            model.add_element(b[i], list(self.class_of), c_i)
            tuples = [(-1, c, k, 0) for c in range(classes) for k in range(num_layers + 1)]
            for r in rows:
                batch, j, place = where[int(r)]
                entries = batch.tables[i].time_s[j]
                tuples += [
                    (place, int(c), int(k), ns(entries[c, k]))
                    for c, k in np.argwhere(np.isfinite(entries))
                ]
            model.add_allowed_assignments([row_var, c_i, n_i, times[i]], tuples)
        slowest = model.new_int_var(0, link.max_ns, f"{name}.Tmax")
        model.add_max_equality(slowest, times)
        for r in rows:
            link.step_at_least(model, int(r), self.shape, slowest, times)
        return TableHandle(b, where)

    def hint(self, handle: TableHandle, plan: StagePlan) -> list[Fix]:
        starts = itertools.accumulate(plan.chunk_layers[:-1])
        return list(zip(handle.plan[1:-1], starts, strict=True))

    def decode(self, solver: cp_model.CpSolver, handle: TableHandle, row: int) -> StagePlan:
        batch, j, _ = handle.where[int(row)]
        return self._plan(batch, j, [int(solver.value(b)) for b in handle.plan])

    def _plan(self, batch: TableBatch, row: int, bounds: list[int]) -> StagePlan:
        """The plan of stage boundaries ``bounds`` on the batch's row ``row``."""
        layers = tuple(hi - lo for lo, hi in itertools.pairwise(bounds))
        recompute = tuple(
            table.recompute(row, self.class_of[bounds[i]], layers[i])
            for i, table in enumerate(batch.tables)
        )
        return StagePlan(pp=self.shape.pp, vpp=1, chunk_layers=layers, recompute=recompute)
