"""Per-stage window tables for pipelines without interleaving (``vpp == 1``) and any layer kinds:
for every outer row, every start layer ``s`` and layer count ``n`` a stage may hold, the least
time of one micro-batch on the stage holding layers ``[s, s+n)`` over its recompute choices
(none, selective, ``full:k`` for its first ``k`` layers) among those that fit its memory
(``inf`` when none fits).

With ``vpp == 1`` a stage is one chunk of consecutive layers, so its time and memory depend only
on that window and its recompute (``autopar.costs.stage_figures.stage_figures``): the best plan for
given stage boundaries takes each stage's entry of these tables, and the plan search reduces to the
boundaries (``autopar.pipeline.search``). Starts whose remaining layers read the same kinds
(``start_classes``: every start after DeepSeek-V3's three dense layers, say) share one row of
the table, which keeps it small: ``classes x (L+1)`` entries per stage and outer row.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autopar.costs.stage_costs import StageCosts
from autopar.costs.stage_figures import in_flight
from autopar.layout.stages import StageRecompute


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
    p: int,
    stage: int,
    num_microbatches: np.ndarray,
    modes: tuple[str, ...],
    capacity_bytes: float,
    starts: Sequence[int],
) -> WindowTable:
    """The table of ``stage`` of a ``p``-stage 1F1B pipeline over the rows of ``costs``, for the
    windows from each start in ``starts`` (``start_classes``)."""
    kinds_all = costs.layer_kinds
    num_layers = len(kinds_all)
    rows = len(num_microbatches)
    w = np.array([in_flight(p, 1, int(m), stage)[0] for m in num_microbatches], dtype=float)
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
) -> tuple[np.ndarray, np.ndarray, list[list[int] | None]]:
    """Per row, exact dynamic programmes over the stage boundaries (``p`` stages, ``L`` layers):

    - ``tau``: the least bottleneck ``max_i T_i`` over all boundaries (a linear partition);
    - the least ``sum_i T_i`` over all boundaries, and the least ``sum_i T_i`` with every
      ``T_i <= tau`` with its boundaries.

    Returns the pipeline part of a lower bound, ``(m - 1) * tau + least sum`` (the 1F1B step
    ``(m - 1) * max_i T_i + sum_i T_i`` of any plan is at least that), the pipeline part of the
    plan found, and its boundaries (``None`` where nothing fits)."""
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
    lower = (m - 1) * tau + least_sum
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
    upper = np.where(np.isfinite(plan_sum), (m - 1) * plan_max + plan_sum, np.inf)
    return np.where(np.isfinite(tau), lower, np.inf), upper, bounds
