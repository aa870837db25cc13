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

A schedule whose longest path depends on the phase times (zero bubble, V: ``_Phased``) is
scored with the path found at reference phase times (the terms' median phases), whose length
at a layout's own times is at most its simulated step (``schedule_slots.schedule_slots``): a lower
bound, ``Scored.exact`` False; the search simulates those (``autopar.search.exact``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from autopar.base.axes import AXIS, FREE_AXES, GRID_AXES, tie_key
from autopar.base.deadline import TimeLimitReached, check_deadline
from autopar.costs.terms import (
    FORWARD_SHARE,
    CostModel,
    CostTerm,
    PhasedSlots,
    PhasedTerm,
    Phases,
    TermContext,
    slot_phases,
    slots_ratio_free,
    term_axes,
    term_phases,
    uniform_slots,
)
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
    exact: bool = True
    """False where ``step_s`` is a lower bound: a schedule whose slots depend on the phase
    times, taken at reference times (module docstring); the caller simulates such layouts."""

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
    allowed = None
    if len(space.domains.get("schedule", ())) > 1:  # 1F1B where a schedule dominates it
        rows, allowed = _with_a_cell(space, rows, fold)
        count = len(next(iter(rows.values())))
    tables: dict[str, _Table] = {}
    try:
        terms = [*_all_terms(cost_model), *([time_factor] if time_factor is not None else [])]
        keys: dict[str, dict[str, np.ndarray]] = {}
        shared: dict[tuple[str, ...], dict[str, np.ndarray]] = {}
        for term in terms:  # the deadline checked before each evaluation
            keys[term.name] = _keys(space, term, rows, fold, shared)
            tables[term.name] = _table(space, ctx, term, keys[term.name], deadline)
        phased = _phased_tables(space, ctx, cost_model, keys, tables, deadline)
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
        times, memory, valid, exact = _chunk_figures(
            space, cost_model, tables, chunk, fold, phased, allowed
        )
        if allowed is not None:
            valid &= allowed[start : start + step]
        if time_factor is not None:
            cache: dict[str, np.ndarray] = {}
            times = times * _gather(space, tables[time_factor.name], chunk, fold, cache)
        fits = valid & (memory <= capacity)
        if upper_bound_s is not None:
            fits &= np.round(times * US_PER_S) <= int(upper_bound_s * US_PER_S)
        acc.layouts += int(valid.sum())
        acc.fitting += int(fits.sum())
        figures = (times, memory, exact)
        _reduce(acc, chunk, fold, figures, valid, fits, top=top, band=band, front=front)
        if by_axis:
            _reduce_by_axis(acc, chunk, fold, figures, valid, fits)
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


def _table(space: Space, ctx: TermContext, term, sub, deadline=None) -> _Table:
    """``term`` on its keys ``sub`` (``_keys``)."""
    size = len(next(iter(sub.values()))) if sub else 1
    values = _evaluated(term, sub, ctx, size, deadline)
    return _table_of(space, space.key_axes(term_axes(term, space.domains)), sub, values)


def _table_of(space: Space, axes: tuple[str, ...], sub, values: np.ndarray) -> _Table:
    """A table of ``values`` on the keys ``sub`` over ``axes``."""
    values = np.asarray(values, dtype=np.float64)
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


def _scaled(table: _Table, factor: float) -> _Table:
    """``table`` with every value times ``factor``."""
    dense = None if table.dense is None else table.dense * factor
    return _Table(axes=table.axes, codes=table.codes, values=table.values * factor, dense=dense)


def _keys(space: Space, term, rows: dict[str, np.ndarray], fold: np.ndarray, cache=None):
    """The term's keys that some row of the space has: its axes' distinct combinations among
    ``rows`` (with the derived columns they fix), crossed with the virtual-stage counts when it
    reads them, less the cells its rules over ``vpp`` forbid; the same keys as
    ``Space.pruned_grid(term.depends_on)`` restricted to the space's layouts, so a term is never
    evaluated on keys no layout has (Mixtral on 997,920 GPUs: 2.0 M keys of its own, 0.4 M rows).
    Terms over the same axes share their keys (``cache``, by axes)."""
    free = tuple(space.free_axes(term_axes(term, space.domains)))
    if cache is None:
        return _axes_keys(space, free, rows, fold)
    if free not in cache:
        cache[free] = _axes_keys(space, free, rows, fold)
    return cache[free]


def _axes_keys(space: Space, free: tuple[str, ...], rows, fold: np.ndarray):
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


def _chunk_figures(
    space: Space, cost_model: CostModel, tables, chunk, fold, phased=None, allowed=None
):
    """Step time, memory, validity and (with ``phased``, else ``None``) exactness of every
    (row, vpp) cell of a chunk."""

    cache: dict[str, np.ndarray] = {}

    def total(terms) -> np.ndarray:
        out = np.zeros((len(chunk["tp"]), 1))
        for term in terms:
            out = out + _gather(space, tables[term.name], chunk, fold, cache)
        return out

    def gather(table: _Table) -> np.ndarray:
        return _gather(space, table, chunk, fold, cache)

    in_flight = gather(tables[cost_model.in_flight.name])
    exact = None
    if phased is None:
        slots = gather(tables[cost_model.slots.name])
        micro = slots * total(cost_model.microbatch_terms)
    else:
        micro, exact = phased.figures(gather, total(cost_model.microbatch_terms))
    times = total(cost_model.step_terms) + micro
    memory = total(cost_model.static_memory_terms) + in_flight * total(
        cost_model.microbatch_memory_terms
    )
    shape = (len(chunk["tp"]), len(fold))
    times, memory = np.broadcast_to(times, shape), np.broadcast_to(memory, shape)
    valid = np.isfinite(times) & np.isfinite(memory)
    if allowed is None:  # else the rules over vpp were checked by _with_a_cell
        for rule in space.rules:
            if FOLD_AXIS in rule.axes:
                valid &= _rule_cells(space, rule, chunk, fold, cache)
    if exact is not None:
        exact = np.broadcast_to(exact, times.shape)
    return times, memory, valid, exact


def _with_a_cell(space: Space, rows, fold: np.ndarray):
    """The rows with a (row, vpp) cell the rules over ``vpp`` allow, and those cells (a row the
    rules refuse at every vpp, 1F1B where the combined 1F1B dominates it, is not scored)."""
    count = len(next(iter(rows.values())))
    allowed = np.ones((count, len(fold)), dtype=bool)
    step = max(1, CHUNK_CELLS // len(fold))
    for start in range(0, count, step):
        chunk = {a: v[start : start + step] for a, v in rows.items()}
        cache: dict[str, np.ndarray] = {}
        for rule in space.rules:
            if FOLD_AXIS in rule.axes:
                allowed[start : start + step] &= _rule_cells(space, rule, chunk, fold, cache)
    keep = allowed.any(axis=1)
    if keep.all():
        return rows, allowed
    return {a: v[keep] for a, v in rows.items()}, allowed[keep]


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


def _scored(chunk, fold, figures, cells: np.ndarray) -> list[Scored]:
    times, memory, exact = figures
    rows, cols = np.divmod(cells, len(fold))
    out = []
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        row = {a: int(chunk[a][r]) for a in GRID_AXES if a != FOLD_AXIS}
        row[FOLD_AXIS] = int(fold[c])
        sure = True if exact is None else bool(exact[r, c])
        out.append(
            Scored(
                row=row,
                step_s=float(times[r, c]),
                memory_bytes=float(memory[r, c]),
                exact=sure,
            )
        )
    return out


def scored_order(item: Scored) -> tuple:
    """The search's order of scored layouts: step time to the microsecond, then ``tie_key``."""
    return (item.step_us, tie_key(item.row))


def _reduce(acc: _Acc, chunk, fold, figures, valid, fits, *, top, band, front) -> None:
    times, memory = figures[0], figures[1]
    flat_t = np.where(fits, times, np.inf).ravel()
    if np.isfinite(flat_t).any():
        best_so_far = acc.best[0].step_s if acc.best else np.inf
        # the top rows of this chunk, with every tie of the last one (to the microsecond)
        k = min(top, int(np.isfinite(flat_t).sum()))
        kth = np.partition(flat_t, k - 1)[k - 1]
        picked = np.flatnonzero(np.round(flat_t * US_PER_S) <= np.round(kth * US_PER_S))
        acc.best = sorted(acc.best + _scored(chunk, fold, figures, picked), key=scored_order)
        acc.best = _keep_top(acc.best, top)
        if band > 0:
            limit = min(best_so_far, float(flat_t.min())) * (1 + band)
            near = np.flatnonzero(flat_t <= limit)
            acc.band = [s for s in acc.band if s.step_s <= limit]
            acc.band += _scored(chunk, fold, figures, near)
    if front:
        flat_m = np.where(valid, memory, np.inf).ravel()
        cells = np.flatnonzero(np.isfinite(flat_m))
        order = cells[np.lexsort((flat_m[cells], np.where(valid, times, np.inf).ravel()[cells]))]
        least = np.minimum.accumulate(flat_m[order])
        keep = order[np.concatenate([[True], least[1:] < least[:-1]])] if len(order) else order
        acc.front = _front(acc.front + _scored(chunk, fold, figures, keep))


def _tie_rank(chunk, cells: dict[str, np.ndarray]) -> np.ndarray:
    """Each row's place in ``tie_key`` order (the axes in ``cells`` override the chunk's)."""
    ordered = (*FREE_AXES, *(a for a in GRID_AXES if a not in FREE_AXES))
    keys = [AXIS[a].prefer * np.asarray(cells.get(a, chunk.get(a))) for a in ordered]
    rank = np.empty(len(keys[0]), dtype=np.int64)
    rank[np.lexsort(keys[::-1])] = np.arange(len(keys[0]))
    return rank


def _reduce_by_axis(acc: _Acc, chunk, fold, figures, valid, fits) -> None:
    """The fastest fitting cell (whole microseconds, then ``tie_key``) and the least memory of
    every value of every free axis in this chunk, merged into ``acc``."""
    times, memory = figures[0], figures[1]
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
            _merge_axis(acc, axis, value, chunk, fold, figures, (r, c), us[r, c], float(low))


def _merge_axis(acc: _Acc, axis, value, chunk, fold, figures, cell, cell_us, low) -> None:
    if not np.isfinite(low):  # no layout the rules allow has this value (here)
        return
    lows = acc.least_by_axis.setdefault(axis, {})
    lows[value] = min(lows.get(value, np.inf), low)
    if not np.isfinite(cell_us):
        return
    r, c = cell
    (item,) = _scored(chunk, fold, figures, np.array([r * len(fold) + c]))
    bests = acc.by_axis.setdefault(axis, {})
    if value not in bests or scored_order(item) < scored_order(bests[value]):
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
    return tuple(sorted((s for s in band_rows if s.step_s <= limit), key=scored_order))


def _front(items: list[Scored]) -> tuple[Scored, ...]:
    """Fastest first, keeping each layout with less memory than every faster one."""
    out: list[Scored] = []
    for item in sorted(items, key=lambda s: (s.step_s, s.memory_bytes)):
        if not out or item.memory_bytes < out[-1].memory_bytes:
            out.append(item)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Phased:
    """A space whose schedules split the micro-batch by phase (module docstring): the forward
    slots at the reference times, the other phases' as differences, and exactness."""

    forward: _Table
    others: tuple[tuple[_Table, tuple[_Table, ...], float], ...]
    """Per phase beyond the forward: (slots less the forward's, or the paired slots; the terms'
    nonzero parts of it; +1, or -1 for what the pairs hide)."""
    exact: _Table

    def figures(self, gather, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each cell's micro-batch part, ``sF * total + (sI - sF) * I + (sW - sF) * W - sP * H``
        (``terms.weighted`` with ``total = F + I + W``), and whether it is exact."""
        forward = gather(self.forward)
        micro = forward * total
        for slots, parts, sign in self.others:
            micro = micro + sign * gather(slots) * sum(gather(t) for t in parts)
        micro = np.where(np.isinf(forward), np.inf, micro)
        return micro, gather(self.exact) > 0.5


def _phased_tables(
    space: Space, ctx: TermContext, cost_model: CostModel, keys_of, totals, deadline
):
    """``_Phased`` when some layout's slots differ by phase or depend on the phase times, else
    ``None`` (every layout is then ``slots * sum of the micro-batch terms``, as for 1F1B);
    ``keys_of``: each term's keys by name (``_keys``); ``totals``: their tables."""
    slots = cost_model.slots
    if not isinstance(slots, PhasedSlots):
        return None
    sub = keys_of[slots.name]
    size = len(next(iter(sub.values()))) if sub else 1
    free = slots_ratio_free(slots, sub, ctx, size)
    nominal = Phases(*(np.full(size, x) for x in (FORWARD_SHARE, 1.0 - FORWARD_SHARE, 0.0, 0.0)))
    if free.all() and uniform_slots(slot_phases(slots, sub, ctx, nominal)).all():
        return None
    parts: list[list[_Table]] = [[], [], []]
    medians = np.zeros(4)
    for term in cost_model.microbatch_terms:
        keys = keys_of[term.name]
        n = len(next(iter(keys.values()))) if keys else 1
        check_deadline(deadline)
        if not isinstance(term, PhasedTerm):  # FORWARD_SHARE of its total (term_phases)
            total = totals[term.name]
            value = float(np.median(total.values)) if len(total.values) else 0.0
            medians += [FORWARD_SHARE * value, (1.0 - FORWARD_SHARE) * value, 0.0, 0.0]
            parts[0].append(_scaled(total, 1.0 - FORWARD_SHARE))
            continue
        phases = term_phases(term, keys, ctx, n)
        medians += [float(np.median(part)) if n else 0.0 for part in phases]
        axes = space.key_axes(term_axes(term, space.domains))
        for i, part in enumerate(phases[1:]):
            if np.any(part != 0):
                parts[i].append(_table_of(space, axes, keys, part))
    at = slot_phases(slots, sub, ctx, Phases(*(np.full(size, x) for x in medians)))
    axes = space.key_axes(term_axes(slots, space.domains))
    with np.errstate(invalid="ignore"):
        steps = (at.backward_input - at.forward, at.backward_weight - at.forward, at.paired_hidden)
    others = []
    for step, terms, sign in zip(steps, parts, (1.0, 1.0, -1.0), strict=True):
        step = np.where(np.isfinite(step), step, 0.0)
        if terms and np.any(step != 0):
            others.append((_table_of(space, axes, sub, step), tuple(terms), sign))
    return _Phased(
        forward=_table_of(space, axes, sub, at.forward),
        others=tuple(others),
        exact=_table_of(space, axes, sub, free.astype(np.float64)),
    )
