"""Per-stage tables for models whose layers are all of one kind, and the encoding that searches
over them (``TableEncoding``).

A table gives, for every outer row and every layer count ``n`` a stage may hold, the least time
of one micro-batch on that stage over the ways to spread ``n`` layers over its chunks and to
recompute them, among those that fit its memory (``inf`` when none fits). Stages are
independent given their layer counts: a stage's time and memory depend only on its own chunks
and recompute (``autopar.costs.stage_figures``). So, with one layer kind, the best plan for given
stage layer counts takes each stage's entry of these tables, and the plan search reduces to the
layer counts per stage. A stage's chunks differ by at most one layer (the first chunk of the
first stage and the last chunk of the last stage, which also hold the embedding and the loss,
may hold fewer), as the interleaved formula requires.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from autopar.costs.stage_costs import StageCosts
from autopar.costs.stage_figures import pipeline_time_s
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
from autopar.pipeline.lower_bound import most_layers, water_fill

BLOCK_ELEMENTS = 1 << 21
"""Full-recompute candidates are priced in blocks of rows of at most this many entries."""


@dataclass(frozen=True, slots=True)
class StageTable:
    """One stage over ``rows`` outer rows and ``0..L`` layers."""

    time_s: np.ndarray
    """``(rows, L+1)``: least time, ``inf`` where nothing fits."""
    option: np.ndarray
    """``(rows, L+1)``: 0 none, 1 selective, ``1 + k`` full for ``k`` layers per chunk."""
    spread: np.ndarray
    """``(rows, L+1)``: which of the spreads of ``n`` layers (``spread_chunks``)."""
    spread_chunks: np.ndarray
    """``(spreads, vpp)``: every chunk layer count considered, by ``n`` then in order."""
    spread_start: np.ndarray
    """``(L+1,)``: the first spread of ``n`` layers in ``spread_chunks``."""

    def recompute(self, row: int, n: int) -> StageRecompute:
        code = int(self.option[row, n])
        if code == 1:
            return StageRecompute("selective", 0)
        return StageRecompute("full", code - 1) if code > 1 else StageRecompute()

    def chunks(self, row: int, n: int) -> tuple[int, ...]:
        spread = self.spread_chunks[int(self.spread_start[n]) + int(self.spread[row, n])]
        return tuple(int(x) for x in spread)


def spread_matrix(
    num_layers: int, p: int, v: int, stage: int, weights: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """(layer count of each spread, spreads ``(S, v)``), ``n`` ascending: for ``n`` layers on
    ``stage``, middle chunks within one layer of each other (the extra ones where fewer
    micro-batches are in flight, ``weights``), the end chunk (first chunk of stage 0, last of
    stage ``p-1``) anywhere from 0 to one above them, ascending."""
    least = max(least_layers(p, v, stage, num_layers), 0)
    if v == 1:
        n = np.arange(least, num_layers + 1)
        return n, n[:, None].astype(np.int64)
    end = 0 if stage == 0 else (v - 1 if stage == p - 1 else None)
    others = [j for j in range(v) if j != end]
    rank = np.zeros(v, dtype=np.int64)
    rank[sorted(others, key=lambda j: (weights[j], -j))] = np.arange(len(others))
    n_all = np.arange(least, num_layers + 1)
    if end is None:
        n, e = n_all, np.zeros_like(n_all)
    else:
        n, e = (a.ravel() for a in np.meshgrid(n_all, np.arange(num_layers + 1), indexing="ij"))
        n, e = n[e <= n], e[e <= n]
    q, extra = np.divmod(n - e, len(others))
    ok = (q >= 1) & (e <= q + 1) if end is not None else q >= 1
    n, e, q, extra = n[ok], e[ok], q[ok], extra[ok]
    chunks = q[:, None] + (rank[None, :] < extra[:, None])
    if end is not None:
        chunks[:, end] = e
    return n, chunks


def _stage_inputs(costs: StageCosts, shape: Shape, stage: int, m: np.ndarray):
    """(time, static bytes and activation bytes outside the layers, in-flight weights per
    chunk ``(rows, v)``, the first row's weights) of ``stage``."""
    p, v = shape.pp, shape.vpp
    fixed_t = costs.every_time_s.copy()
    static = costs.every_static_bytes.copy()
    extra = np.zeros((len(m), v))
    extra[:, 0] += costs.every_activation_bytes
    if stage == 0:
        fixed_t = fixed_t + costs.first_time_s
        static = static + costs.first_static_bytes
        extra[:, 0] += costs.first_activation_bytes
    if stage == p - 1:
        fixed_t = fixed_t + costs.last_time_s
        static = static + costs.last_static_bytes
        extra[:, v - 1] += costs.last_activation_bytes
    distinct = np.unique(m)
    table = np.array([shape.schedule.in_flight(p, v, int(x), stage) for x in distinct], dtype=float)
    w = table[np.searchsorted(distinct, m)]
    return fixed_t, static, (w * extra).sum(axis=1), w, tuple(int(x) for x in table[0])


def _full_recompute(none_t, none_mem, spreads, ns_, w, costs, kind, modes, capacity):
    """The least time with full recompute per (row, spread) over ``k`` layers per chunk
    (``1..max chunk``, or only the max without ``none``), and its ``k``."""
    t, a = costs.time_s[kind], costs.activation_bytes[kind]
    d = spreads.astype(np.float64)
    top = spreads.max(axis=1)
    k_max = int(top.max(initial=0))
    rows, size = none_t.shape
    chosen = np.full((rows, size), np.inf)
    k_pick = np.zeros((rows, size), dtype=np.int64)
    if k_max == 0:
        return chosen, k_pick
    ks = np.arange(1, k_max + 1)
    valid = (ks[None, :] <= top[:, None]) if "none" in modes else (ks[None, :] == top[:, None])
    valid &= (ns_ > 0)[:, None]
    mins = np.minimum(ks[None, :, None], d[:, None, :])  # spreads x K x v
    recomputed = mins.sum(axis=2)
    step = max(1, BLOCK_ELEMENTS // (size * k_max))
    for lo in range(0, rows, step):
        r = slice(lo, min(rows, lo + step))
        saved = np.einsum("rj,skj->rsk", w[r], mins)
        time_k = none_t[r][:, :, None] + recomputed[None] * (t[r, 2] - t[r, 0])[:, None, None]
        workspace = (none_mem[r] + costs.full_workspace_bytes[r][:, None])[:, :, None]
        mem_k = workspace - saved * (a[r, 0] - a[r, 2])[:, None, None]
        time_k = np.where(valid[None] & (mem_k <= capacity), time_k, np.inf)
        pick = np.argmin(time_k, axis=2)
        chosen[r] = np.take_along_axis(time_k, pick[:, :, None], axis=2)[:, :, 0]
        k_pick[r] = ks[pick]
    return chosen, k_pick


def _candidates(costs, inputs, modes, capacity, ns_, spreads):
    """(time, option code) arrays ``(rows, spreads)`` of each recompute choice, in the order
    none, selective, full (ties go to the first); ``inputs`` from ``_stage_inputs``."""
    kind = costs.layer_kinds[0]
    t, a, s = costs.time_s[kind], costs.activation_bytes[kind], costs.static_bytes[kind]
    fixed_t, static, fixed_act, w, _ = inputs
    n = ns_.astype(np.float64)[None, :]
    weighted = w @ spreads.T.astype(np.float64)
    base_static = static[:, None] + n * s[:, None]
    none_mem = base_static + fixed_act[:, None] + weighted * a[:, 0:1]
    none_t = n * t[:, 0:1] + fixed_t[:, None]
    zeros = np.zeros(none_t.shape, dtype=np.int64)
    out = []
    if "none" in modes:
        out.append((np.where(none_mem <= capacity, none_t, np.inf), zeros))
    if "selective" in modes:
        mem = base_static + costs.selective_workspace_bytes[:, None] + fixed_act[:, None]
        mem = mem + weighted * a[:, 1:2]
        sel_t = n * t[:, 1:2] + fixed_t[:, None]
        out.append((np.where(mem <= capacity, sel_t, np.inf), zeros + 1))
    if "full" in modes:
        chosen, k = _full_recompute(none_t, none_mem, spreads, ns_, w, costs, kind, modes, capacity)
        out.append((chosen, 1 + k))
    return out


def stage_table(
    costs: StageCosts,
    *,
    shape: Shape,
    stage: int,
    num_microbatches: np.ndarray,
    modes: tuple[str, ...],
    capacity_bytes: float,
) -> StageTable:
    """The table of ``stage`` over the rows of ``costs`` (one layer kind): every (layer count,
    spread, recompute) at once, the least time per layer count, ties to the first spread and
    then to none, selective, full with the fewest layers."""
    num_layers, rows = len(costs.layer_kinds), len(num_microbatches)
    inputs = _stage_inputs(costs, shape, stage, num_microbatches)
    ns_, spreads = spread_matrix(num_layers, shape.pp, shape.vpp, stage, inputs[4])
    counts = np.bincount(ns_, minlength=num_layers + 1)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    options = _candidates(costs, inputs, modes, capacity_bytes, ns_, spreads)
    time_s = np.full((rows, num_layers + 1), np.inf)
    option = np.zeros((rows, num_layers + 1), dtype=np.int64)
    spread = np.zeros((rows, num_layers + 1), dtype=np.int64)
    if len(ns_) and options:
        c = len(options)
        flat_t = np.stack([o[0] for o in options], axis=2).reshape(rows, -1)
        flat_code = np.stack([o[1] for o in options], axis=2).reshape(rows, -1)
        # every candidate of n layers in one row of a padded array, in the loop's order
        place = (np.arange(len(ns_)) - start[ns_])[:, None] * c + np.arange(c)[None, :]
        padded = np.full((rows, num_layers + 1, int(counts.max()) * c), np.inf)
        padded[:, np.repeat(ns_, c), place.ravel()] = flat_t
        pick = np.argmin(padded, axis=2)
        best = np.take_along_axis(padded, pick[:, :, None], axis=2)[:, :, 0]
        local, which = np.divmod(pick, c)
        flat = np.minimum((start[None, :] + local) * c + which, flat_t.shape[1] - 1)
        ok = np.isfinite(best)
        time_s = best
        option = np.where(ok, np.take_along_axis(flat_code, flat, axis=1), 0)
        spread = np.where(ok, local, 0)
    return StageTable(time_s, option, spread, spreads, start)


@dataclass(frozen=True, slots=True)
class TableEncoding:
    """One layer kind: the plan is the layer count of every stage; each stage's time is its
    table's entry for the chosen row (module docstring)."""

    shape: Shape
    batches: tuple[TableBatch, ...] = ()

    def tighten(
        self, bounds: Bounds, rows: np.ndarray, ctx: PlanContext
    ) -> tuple[TableEncoding, Bounds]:
        """Tables for ``rows``, a lower bound per row (the least slowest stage by
        water-filling the tables, and every layer's time without recompute) and the plan of
        the water-filled counts (an upper bound)."""
        sub, m = ctx.costs.take(rows), ctx.microbatches(rows)
        tables = tuple(
            stage_table(
                sub, shape=self.shape, stage=i, num_microbatches=m, modes=ctx.modes,
                capacity_bytes=ctx.capacity_bytes,
            )
            for i in range(self.shape.pp)
        )  # fmt: skip
        batch = TableBatch(rows, tables)
        bound, steps, counts = _table_bounds(tables, sub, self.shape, m)
        tightened = bounds.tightened(rows, bound, steps, lambda j: _plan(batch, j, counts[j]))
        return TableEncoding(self.shape, (*self.batches, batch)), tightened

    def add(self, model: cp_model.CpModel, rows: np.ndarray, link: RowLink) -> TableHandle:
        """Stage ``i`` takes ``n_i`` layers and its time is its table's entry for the chosen row
        (an allowed-assignments table over (row, n_i, T_i)); the bottleneck by
        ``add_max_equality``; the objective per row under its boolean."""
        p, num_layers, name = self.shape.pp, link.ctx.num_layers, self.shape.name
        row_var, where = link.table_row(model, name, rows, self.batches)
        least = [least_layers(p, self.shape.vpp, i, num_layers) for i in range(p)]
        n = [model.new_int_var(least[i], num_layers, f"{name}.n{i}") for i in range(p)]
        model.add(sum(n) == num_layers)
        times = [model.new_int_var(0, link.max_ns, f"{name}.T{i}") for i in range(p)]
        for i in range(p):
            tuples = [(-1, k, 0) for k in range(num_layers + 1)]
            for r in rows:
                batch, j, place = where[int(r)]
                entries = batch.tables[i].time_s[j]
                tuples += [
                    (place, int(k), ns(entries[k])) for k in np.flatnonzero(np.isfinite(entries))
                ]
            model.add_allowed_assignments([row_var, n[i], times[i]], tuples)
        slowest = model.new_int_var(0, link.max_ns, f"{name}.Tmax")
        model.add_max_equality(slowest, times)
        for r in rows:
            link.step_at_least(model, int(r), self.shape, slowest, times)
        # Middle stages whose tables agree on every row are interchangeable: order their counts.
        for i in range(1, p - 2):
            if all(
                np.array_equal(b.tables[i].time_s, b.tables[i + 1].time_s) for b in self.batches
            ):
                model.add(n[i] >= n[i + 1])
        return TableHandle(n, where)

    def hint(self, handle: TableHandle, plan: StagePlan) -> list[Fix]:
        return list(zip(handle.plan, [plan.stage_layers(i) for i in range(plan.pp)], strict=True))

    def decode(self, solver: cp_model.CpSolver, handle: TableHandle, row: int) -> StagePlan:
        batch, j, _ = handle.where[int(row)]
        return _plan(batch, j, [int(solver.value(n)) for n in handle.plan])


def _table_bounds(tables: tuple[StageTable, ...], costs: StageCosts, shape: Shape, m):
    """Per row: a lower bound (the least possible slowest stage, by water-filling the exact
    tables, and the time of every layer without recompute), the step of the plan of the
    water-filled counts (an upper bound; ``inf`` where none) and those counts."""
    p, v = shape.pp, shape.vpp
    num_layers = len(costs.layer_kinds)
    times = [t.time_s for t in tables]
    least = [least_layers(p, v, i, num_layers) for i in range(p)]
    lo, _, most = water_fill(times, least, num_layers, most_layers)
    counts = np.stack(most, axis=1)
    feasible = counts.sum(axis=1) >= num_layers
    kind = costs.layer_kinds[0]
    total = (
        num_layers * costs.time_s[kind][:, 0]
        + p * costs.every_time_s
        + costs.first_time_s
        + costs.last_time_s
    )
    pipeline = shape.schedule.pipeline_s(lo, total, m, pp=p, vpp=v)
    bound = np.where(feasible, costs.step_time_s + pipeline, np.inf)
    steps = np.full(len(m), np.inf)
    chosen: list[list[int] | None] = [None] * len(m)
    for r in np.flatnonzero(feasible):
        n = [int(x) for x in counts[r]]
        surplus = sum(n) - num_layers
        for i in range(p):
            cut = min(surplus, n[i] - least[i])
            n[i] -= cut
            surplus -= cut
        stage_t = np.array([[times[i][r, n[i]] for i in range(p)]])
        if not np.isfinite(stage_t).all():
            continue
        step = pipeline_time_s(stage_t, m[r : r + 1], v, schedule=shape.schedule)[0]
        steps[r] = costs.step_time_s[r] + step
        chosen[r] = n
    return bound, steps, chosen


def _plan(batch: TableBatch, row: int, n) -> StagePlan:
    """The plan of layer counts ``n`` per stage on the batch's row ``row``."""
    p = len(batch.tables)
    v = batch.tables[0].spread_chunks.shape[1]
    chunks = [0] * (p * v)
    recompute = []
    for i, table in enumerate(batch.tables):
        for j, layers in enumerate(table.chunks(row, int(n[i]))):
            chunks[j * p + i] = layers
        recompute.append(table.recompute(row, int(n[i])))
    return StagePlan(pp=p, vpp=v, chunk_layers=tuple(chunks), recompute=tuple(recompute))
