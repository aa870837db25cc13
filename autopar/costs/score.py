"""Every layout of a space scored, exactly and fast: the cost model's terms as tables joined in
numpy (issue 21: an answer whatever the load).

Each term is evaluated once, on its own axes (the keys of ``Space.pruned_grid(term.depends_on)``
that some layout has: the tables the CP-SAT model links with indicators, DESIGN §3), and its
values are gathered onto the rows of the space by a key code over those axes. The virtual-stage
axis is folded: the rows are the layouts of every other axis, each with one column per
virtual-stage count, and the rules and terms that read ``vpp`` are evaluated on that matrix; the
space grows with the virtual-stage counts Megatron accepts without the rows growing with them.
Step time and memory are composed as ``autopar.costs.terms`` composes them (``steps + slots *
micro-batch terms``; ``static + in_flight * micro-batch memory``), in float, so every layout has
the figure ``estimate`` gives it.

The result keeps what a search answers with: the best layouts in the documented order (step time
to the microsecond, then ``autopar.base.axes.tie_key``), the layouts within a band of the best,
and the front of least memory against step time (what comes closest to fitting). Rows are
processed in chunks, the deadline checked between them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from autopar.base.axes import AXIS, FREE_AXES, GRID_AXES, tie_key
from autopar.base.deadline import TimeLimitReached, check_deadline
from autopar.costs.terms import CostModel, CostTerm, TermContext
from autopar.layout.space import DERIVED, Space

FOLD_AXIS = "vpp"
US_PER_S = 1_000_000
CHUNK_CELLS = 1 << 20
"""Layout cells (rows x virtual-stage counts) scored at once: about 40 MB of arrays."""
DENSE_CODES = 1 << 22
"""A table whose key codes span at most this many values is looked up by index (32 MB)."""


@dataclass(frozen=True, slots=True)
class Scored:
    """One layout: its grid row (``Layout.from_grid_row``), step time and peak memory."""

    row: dict[str, int]
    step_s: float
    memory_bytes: float

    @property
    def step_us(self) -> int:
        return int(round(self.step_s * US_PER_S))


@dataclass(frozen=True, slots=True, kw_only=True)
class Scores:
    """What scoring every layout of a space found."""

    layouts: int
    """Layouts the rules allow (every one was scored)."""
    fitting: int
    """Of them, those within the usable memory."""
    best: tuple[Scored, ...]
    """The ``top`` best fitting layouts, best first (step time to the microsecond, then
    ``tie_key``)."""
    within_band: tuple[Scored, ...] = ()
    """Every fitting layout within ``band`` of the best step time, fastest first."""
    front: tuple[Scored, ...] = ()
    """Fastest first, each layout with less memory than every faster one (fitting or not):
    the least memory at each step time (``front=True``)."""
    complete: bool = True
    """False when the deadline ended scoring early (the figures cover the rows scored)."""
    by_axis: dict[str, dict[int, Scored]] = field(default_factory=dict)
    """For every free axis and each of its values, the fastest fitting layout with that value
    (``by_axis=True``; the order of ``best``)."""
    least_by_axis: dict[str, dict[int, float]] = field(default_factory=dict)
    """For every free axis and each of its values the rules allow in some layout, the least
    memory of a layout with it, fitting or not (``by_axis=True``)."""


@dataclass(slots=True)
class _Table:
    """One term's values on its own key axes, indexed by key code (dense when the code space is
    small, else sorted codes searched)."""

    axes: tuple[str, ...]
    codes: np.ndarray
    values: np.ndarray
    dense: np.ndarray | None = None


@dataclass(slots=True)
class _Acc:
    """Running reductions over the chunks."""

    layouts: int = 0
    fitting: int = 0
    best: list[Scored] = field(default_factory=list)
    band: list[Scored] = field(default_factory=list)
    front: list[Scored] = field(default_factory=list)
    by_axis: dict[str, dict[int, Scored]] = field(default_factory=dict)
    least_by_axis: dict[str, dict[int, float]] = field(default_factory=dict)


def score_space(
    space: Space,
    ctx: TermContext,
    cost_model: CostModel,
    *,
    top: int = 1,
    band: float = 0.0,
    front: bool = False,
    by_axis: bool = False,
    deadline: float | None = None,
    time_factor: CostTerm | None = None,
    upper_bound_s: float | None = None,
) -> Scores:
    """Score every layout of ``space`` (module docstring); ``band``: keep the fitting layouts
    within ``(1 + band)`` of the best step time; ``front``: keep the memory front; ``by_axis``:
    keep the fastest layout and the least memory of every value of every axis. With
    ``time_factor`` every step time is multiplied by it (the expected time per useful step,
    ``autopar.costs.goodput``), as CP-SAT's objective is; with ``upper_bound_s`` only layouts
    whose (so multiplied) step time is at most that count as fitting."""
    rows = space.pruned_grid([a for a in GRID_AXES if a != FOLD_AXIS])
    fold = np.array(space.domains[FOLD_AXIS], dtype=np.int64)
    count = len(next(iter(rows.values()))) if rows else 0
    if not count or not len(fold):
        return Scores(layouts=0, fitting=0, best=())
    tables: dict[str, _Table] = {}
    try:
        terms = [*_all_terms(cost_model), *([time_factor] if time_factor is not None else [])]
        for term in terms:  # the deadline checked before each evaluation
            tables[term.name] = _table(space, ctx, term, rows, fold, deadline)
    except TimeLimitReached:  # not one layout scored
        return Scores(layouts=0, fitting=0, best=(), complete=False)
    step = max(1, CHUNK_CELLS // len(fold))
    acc, complete = _Acc(), True
    capacity = float(ctx.cluster.usable_memory_bytes)
    for start in range(0, count, step):
        if deadline is not None and start:
            try:
                check_deadline(deadline)
            except TimeLimitReached:  # keep what was scored
                complete = False
                break
        chunk = {a: v[start : start + step] for a, v in rows.items()}
        times, memory, valid = _chunk_figures(space, cost_model, tables, chunk, fold)
        if time_factor is not None:
            cache: dict[str, np.ndarray] = {}
            times = times * _gather(space, tables[time_factor.name], chunk, fold, cache)
        fits = valid & (memory <= capacity)
        if upper_bound_s is not None:
            fits &= np.round(times * US_PER_S) <= int(upper_bound_s * US_PER_S)
        acc.layouts += int(valid.sum())
        acc.fitting += int(fits.sum())
        _reduce(acc, chunk, fold, times, memory, valid, fits, top=top, band=band, front=front)
        if by_axis:
            _reduce_by_axis(acc, chunk, fold, times, memory, valid, fits)
    return Scores(
        layouts=acc.layouts,
        fitting=acc.fitting,
        best=tuple(acc.best[:top]),
        within_band=_within(acc.band, acc.best, band),
        front=_front(acc.front) if front else (),
        complete=complete,
        by_axis=acc.by_axis,
        least_by_axis=acc.least_by_axis,
    )


def _all_terms(cost_model: CostModel) -> Iterable:
    yield from cost_model.step_terms
    yield from cost_model.microbatch_terms
    yield from cost_model.static_memory_terms
    yield from cost_model.microbatch_memory_terms
    yield cost_model.slots
    yield cost_model.in_flight


def _radix(space: Space, axis: str) -> int:
    return len(space.domains[axis]) + 1


def _index(space: Space, grid: dict[str, np.ndarray], axis: str, cache: dict | None = None):
    """Position of each row's value in the axis's domain (memoised per chunk in ``cache``)."""
    if cache is not None and axis in cache:
        return cache[axis]
    domain = np.array(space.domains[axis], dtype=np.int64)
    index = np.searchsorted(domain, grid[axis])
    if cache is not None:
        cache[axis] = index
    return index


def _codes(space: Space, grid: dict[str, np.ndarray], axes: tuple[str, ...], cache=None):
    """Mixed-radix code of each row over ``axes`` (index of its value in each domain)."""
    code = np.zeros(len(grid[axes[0]]), dtype=np.int64)
    for axis in axes:
        code = code * _radix(space, axis) + _index(space, grid, axis, cache)
    return code


def _table(space: Space, ctx: TermContext, term, rows, fold, deadline=None) -> _Table:
    axes = space.key_axes(term.depends_on)
    sub = _keys(space, term, rows, fold)
    size = len(next(iter(sub.values()))) if sub else 1
    values = _evaluated(term, sub, ctx, size, deadline)
    if not axes:
        return _Table(axes=(), codes=np.zeros(1, dtype=np.int64), values=values[:1].copy())
    ordered = (*[a for a in axes if a != FOLD_AXIS], *[a for a in axes if a == FOLD_AXIS])
    codes = _codes(space, sub, ordered)
    span = int(np.prod([_radix(space, a) for a in ordered]))
    if span <= DENSE_CODES:
        dense = np.full(span, np.nan)
        dense[codes] = values
        return _Table(axes=ordered, codes=codes, values=values, dense=dense)
    order = np.argsort(codes, kind="stable")
    return _Table(axes=ordered, codes=codes[order], values=values[order])


def _keys(space: Space, term, rows: dict[str, np.ndarray], fold: np.ndarray):
    """The term's keys that some row of the space has: its axes' distinct combinations among
    ``rows`` (with the derived columns they fix), crossed with the virtual-stage counts when it
    reads them, less the cells its rules over ``vpp`` forbid; the same keys as
    ``Space.pruned_grid(term.depends_on)`` restricted to the space's layouts, so a term is never
    evaluated on keys no layout has (Mixtral on 997,920 GPUs: 2.0 M keys of its own, 0.4 M rows)."""
    free = space.free_axes(term.depends_on)
    outer = [a for a in free if a != FOLD_AXIS]
    if not free:
        return {}
    if outer:
        _, first = np.unique(_codes(space, rows, tuple(outer)), return_index=True)
        derived = [a for a in DERIVED if a in rows and set(space.free_axes([a])) <= set(outer)]
        sub = {a: rows[a][first] for a in (*outer, *derived)}
    else:
        sub = {}
    if FOLD_AXIS not in free:
        return sub
    n = len(first) if outer else 1
    sub = {a: np.repeat(v, len(fold)) for a, v in sub.items()}
    sub[FOLD_AXIS] = np.tile(fold, n)
    keep = np.ones(len(sub[FOLD_AXIS]), dtype=bool)
    for rule in space.rules:
        if FOLD_AXIS in rule.axes and set(rule.axes) <= set(sub):
            keep &= rule.check(sub)
    return {a: v[keep] for a, v in sub.items()}


def _evaluated(term, sub: dict[str, np.ndarray], ctx: TermContext, size: int, deadline):
    """``term`` on every row of ``sub``, ``CHUNK_CELLS`` rows at a time, the deadline checked
    before each (a term over millions of keys takes seconds: 997,920 GPUs)."""
    check_deadline(deadline)
    if size <= CHUNK_CELLS:
        return np.broadcast_to(np.asarray(term.evaluate(sub, ctx), dtype=np.float64), (size,))
    out = np.empty(size)
    for start in range(0, size, CHUNK_CELLS):
        check_deadline(deadline)
        part = {a: v[start : start + CHUNK_CELLS] for a, v in sub.items()}
        out[start : start + CHUNK_CELLS] = term.evaluate(part, ctx)
    return out


def _gather(space: Space, table: _Table, chunk, fold: np.ndarray, cache: dict):
    """The table's value on every row (a column) or every (row, vpp) cell (a matrix); NaN where
    the table has no such key (a combination the rules forbid)."""
    if not table.axes:
        return table.values[0]
    folded = table.axes[-1] == FOLD_AXIS
    outer = table.axes[:-1] if folded else table.axes
    code = (
        _codes(space, chunk, outer, cache) if outer else np.zeros(len(chunk["tp"]), dtype=np.int64)
    )
    if folded:
        fold_index = np.searchsorted(np.array(space.domains[FOLD_AXIS], dtype=np.int64), fold)
        code = code[:, None] * _radix(space, FOLD_AXIS) + fold_index[None, :]
    if table.dense is not None:
        out = table.dense[code]
    else:
        pos = np.minimum(np.searchsorted(table.codes, code), len(table.codes) - 1)
        out = np.where(table.codes[pos] == code, table.values[pos], np.nan)
    return out if folded else out[:, None]


def _chunk_figures(space: Space, cost_model: CostModel, tables, chunk, fold):
    """Step time, memory and validity of every (row, vpp) cell of a chunk."""

    cache: dict[str, np.ndarray] = {}

    def total(terms) -> np.ndarray:
        out = np.zeros((len(chunk["tp"]), 1))
        for term in terms:
            out = out + _gather(space, tables[term.name], chunk, fold, cache)
        return out

    slots = _gather(space, tables[cost_model.slots.name], chunk, fold, cache)
    in_flight = _gather(space, tables[cost_model.in_flight.name], chunk, fold, cache)
    times = total(cost_model.step_terms) + slots * total(cost_model.microbatch_terms)
    memory = total(cost_model.static_memory_terms) + in_flight * total(
        cost_model.microbatch_memory_terms
    )
    shape = (len(chunk["tp"]), len(fold))
    times, memory = np.broadcast_to(times, shape), np.broadcast_to(memory, shape)
    valid = np.isfinite(times) & np.isfinite(memory)
    for rule in space.rules:
        if FOLD_AXIS in rule.axes:
            valid &= _rule_cells(space, rule, chunk, fold, cache)
    return times, memory, valid


def _rule_cells(space: Space, rule, chunk, fold: np.ndarray, cache: dict) -> np.ndarray:
    """A rule over ``vpp`` on every (row, vpp) cell, checked once per distinct combination of
    its other axes."""
    others = tuple(a for a in rule.axes if a != FOLD_AXIS)
    if others:
        codes, first, inverse = np.unique(
            _codes(space, chunk, others, cache), return_index=True, return_inverse=True
        )
    else:
        first, inverse = np.zeros(1, dtype=np.int64), np.zeros(len(chunk["tp"]), dtype=np.int64)
    combos = {a: np.repeat(chunk[a][first], len(fold)) for a in others}
    combos[FOLD_AXIS] = np.tile(fold, len(first))
    ok = np.asarray(rule.check(combos), dtype=bool).reshape(len(first), len(fold))
    return ok[inverse.ravel()]


def _scored(chunk, fold, times, memory, cells: np.ndarray) -> list[Scored]:
    rows, cols = np.divmod(cells, len(fold))
    out = []
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        row = {a: int(chunk[a][r]) for a in GRID_AXES if a != FOLD_AXIS}
        row[FOLD_AXIS] = int(fold[c])
        out.append(Scored(row=row, step_s=float(times[r, c]), memory_bytes=float(memory[r, c])))
    return out


def _order(item: Scored) -> tuple:
    return (item.step_us, tie_key(item.row))


def _reduce(acc: _Acc, chunk, fold, times, memory, valid, fits, *, top, band, front) -> None:
    flat_t = np.where(fits, times, np.inf).ravel()
    if np.isfinite(flat_t).any():
        best_so_far = acc.best[0].step_s if acc.best else np.inf
        # the top rows of this chunk, with every tie of the last one (to the microsecond)
        k = min(top, int(np.isfinite(flat_t).sum()))
        kth = np.partition(flat_t, k - 1)[k - 1]
        picked = np.flatnonzero(np.round(flat_t * US_PER_S) <= np.round(kth * US_PER_S))
        acc.best = sorted(acc.best + _scored(chunk, fold, times, memory, picked), key=_order)
        acc.best = _keep_top(acc.best, top)
        if band > 0:
            limit = min(best_so_far, float(flat_t.min())) * (1 + band)
            near = np.flatnonzero(flat_t <= limit)
            acc.band = [s for s in acc.band if s.step_s <= limit]
            acc.band += _scored(chunk, fold, times, memory, near)
    if front:
        flat_m = np.where(valid, memory, np.inf).ravel()
        cells = np.flatnonzero(np.isfinite(flat_m))
        order = cells[np.lexsort((flat_m[cells], np.where(valid, times, np.inf).ravel()[cells]))]
        least = np.minimum.accumulate(flat_m[order])
        keep = order[np.concatenate([[True], least[1:] < least[:-1]])] if len(order) else order
        acc.front = _front(acc.front + _scored(chunk, fold, times, memory, keep))


def _tie_rank(chunk, cells: dict[str, np.ndarray]) -> np.ndarray:
    """Each row's place in ``tie_key`` order (the axes in ``cells`` override the chunk's)."""
    ordered = (*FREE_AXES, *(a for a in GRID_AXES if a not in FREE_AXES))
    keys = [AXIS[a].prefer * np.asarray(cells.get(a, chunk.get(a))) for a in ordered]
    rank = np.empty(len(keys[0]), dtype=np.int64)
    rank[np.lexsort(keys[::-1])] = np.arange(len(keys[0]))
    return rank


def _reduce_by_axis(acc: _Acc, chunk, fold, times, memory, valid, fits) -> None:
    """The fastest fitting cell (whole microseconds, then ``tie_key``) and the least memory of
    every value of every free axis in this chunk, merged into ``acc``."""
    n = len(chunk["tp"])
    us = np.where(fits, np.round(times * US_PER_S), np.inf)
    mem = np.where(valid, memory, np.inf)
    col = np.argmin(us, axis=1)  # among a row's ties the smallest vpp (tie_key's order)
    row_us = us[np.arange(n), col]
    rank = _tie_rank(chunk, {FOLD_AXIS: fold[col]})
    rank_x = _tie_rank(chunk, {FOLD_AXIS: np.zeros(n, dtype=np.int64)})  # vpp fixed: x order
    for axis in FREE_AXES:
        if axis == FOLD_AXIS:
            values = fold
            cells = [(int(np.lexsort((rank_x, us[:, c]))[0]), c) for c in range(len(fold))]
            least = mem.min(axis=0)
        else:
            column = chunk[axis]
            order = np.lexsort((rank, row_us, column))
            values, first = np.unique(column[order], return_index=True)
            cells = [(int(order[i]), int(col[order[i]])) for i in first]
            least = [mem[column == v].min() for v in values]
        for value, (r, c), low in zip(values.tolist(), cells, least, strict=True):
            _merge_axis(acc, axis, value, chunk, fold, times, memory, (r, c), us[r, c], float(low))


def _merge_axis(acc: _Acc, axis, value, chunk, fold, times, memory, cell, cell_us, low) -> None:
    if not np.isfinite(low):  # no layout the rules allow has this value (here)
        return
    lows = acc.least_by_axis.setdefault(axis, {})
    lows[value] = min(lows.get(value, np.inf), low)
    if not np.isfinite(cell_us):
        return
    r, c = cell
    (item,) = _scored(chunk, fold, times, memory, np.array([r * len(fold) + c]))
    bests = acc.by_axis.setdefault(axis, {})
    if value not in bests or _order(item) < _order(bests[value]):
        bests[value] = item


def _keep_top(ranked: list[Scored], top: int) -> list[Scored]:
    """The first ``top`` and every row tied (to the microsecond) with the last of them."""
    if len(ranked) <= top:
        return ranked
    last = ranked[top - 1].step_us
    return [s for s in ranked if s.step_us <= last]


def _within(band_rows: list[Scored], best: list[Scored], band: float) -> tuple[Scored, ...]:
    if band <= 0 or not best:
        return ()
    limit = best[0].step_s * (1 + band)
    return tuple(sorted((s for s in band_rows if s.step_s <= limit), key=_order))


def _front(items: list[Scored]) -> tuple[Scored, ...]:
    """Fastest first, keeping each layout with less memory than every faster one."""
    out: list[Scored] = []
    for item in sorted(items, key=lambda s: (s.step_s, s.memory_bytes)):
        if not out or item.memory_bytes < out[-1].memory_bytes:
            out.append(item)
    return tuple(out)
