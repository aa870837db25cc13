"""Every layout of a space scored, exactly and fast: the cost model's terms as tables joined in
numpy (issue 21: an answer whatever the load).

Each term is evaluated once, on its own axes (the keys of ``Space.pruned_grid(term.depends_on)``
that some layout has: the tables the CP-SAT model links with indicators, DESIGN §3), and its
values are gathered onto the rows of the space by a key code over those axes. The virtual-stage
axis, and the pipeline schedule when several are searched, are folded
(``autopar.costs.score_tables.Fold``): the rows are the layouts of every other axis, each with
one column per (vpp, schedule) pair, and the rules and terms that read those are evaluated on
that matrix; the space grows with the virtual-stage counts Megatron accepts and the schedules
searched without the rows growing with them.
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

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from autopar.base.axes import AXIS, FREE_AXES, GRID_AXES, tie_key
from autopar.base.deadline import TimeLimitReached, check_deadline
from autopar.costs.score_tables import (
    CHUNK_CELLS,
    Fold,
    Table,
    column_groups,
    evaluated,
    fold_of,
    gather,
    gather_cells,
    keys_of,
    rule_cells,
    scaled,
    table_like,
    table_of,
    unsettled,
)
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
from autopar.layout.space import Space

US_PER_S = 1_000_000
CHECK_CELLS = CHUNK_CELLS // 8
"""The deadline is checked once this many cells were scored since the last check (a group of
rows may be a small chunk)."""


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
    fold = fold_of(space)
    rows = space.pruned_grid([a for a in GRID_AXES if a not in fold.axes])
    count = len(next(iter(rows.values()))) if rows else 0
    if not count or not len(fold):
        return Scores(layouts=0, fitting=0, best=())
    tables: dict[str, Table] = {}
    try:
        terms = [*_all_terms(cost_model), *([time_factor] if time_factor is not None else [])]
        keys: dict[str, dict[str, np.ndarray]] = {}
        shared: dict[tuple[str, ...], dict[str, np.ndarray]] = {}
        # phased slots are evaluated as one table only where no schedule splits the phases
        # (``_phased_tables`` is None): the phased figures read per-phase tables instead
        later = cost_model.slots if isinstance(cost_model.slots, PhasedSlots) else None
        phases: dict[str, Phases] | None = None if later is None else {}
        memory = {
            t.name for t in (*cost_model.static_memory_terms, *cost_model.microbatch_memory_terms)
        }
        made: dict[tuple, tuple] = {}  # the tables' layouts by their keys (``_table``)
        index: dict[str, np.ndarray] = {}  # the rows' places in the domains, by axis
        for term in terms:  # the deadline checked before each evaluation
            keys[term.name] = keys_of(space, term, rows, fold, shared, index)
            if term is not later:
                table = _table(space, ctx, term, keys[term.name], fold, deadline, phases, made)
                tables[term.name] = _constant(table) if term.name in memory else table
        phased = _phased_tables(space, ctx, cost_model, (keys, tables, phases), fold, deadline)
        if later is not None and phased is None:
            tables[later.name] = _table(space, ctx, later, keys[later.name], fold, deadline)
    except TimeLimitReached:  # not one layout scored
        return Scores(layouts=0, fitting=0, best=(), complete=False)
    acc, complete, cells = _Acc(), True, 0
    capacity = float(ctx.cluster.usable_memory_bytes)
    for chunk, columns in _chunks(space, rows, fold):
        if deadline is not None and cells >= CHECK_CELLS:
            cells = 0
            try:
                check_deadline(deadline)
            except TimeLimitReached:  # keep what was scored
                complete = False
                break
        cells += len(chunk["tp"]) * len(columns)
        times, memory, valid, exact = _chunk_figures(
            space, cost_model, tables, chunk, columns, phased
        )
        if time_factor is not None:
            cache: dict[str, np.ndarray] = {}
            times = times * gather(space, tables[time_factor.name], chunk, columns, cache)
        fits = valid & (memory <= capacity)
        if upper_bound_s is not None:
            fits &= np.round(times * US_PER_S) <= int(upper_bound_s * US_PER_S)
        acc.layouts += int(valid.sum())
        acc.fitting += int(fits.sum())
        figures = (times, memory, exact)
        _reduce(acc, chunk, columns, figures, valid, fits, top=top, band=band, front=front)
        if by_axis:
            _reduce_by_axis(acc, chunk, columns, figures, valid, fits)
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


def _chunks(space: Space, rows, fold: Fold):
    """``(rows, columns)`` of at most about ``CHUNK_CELLS`` cells, group by group
    (``score_tables.column_groups``)."""
    for index, columns in column_groups(space, rows, fold):
        step = max(1, CHUNK_CELLS // len(columns))
        for start in range(0, len(index), step):
            part = index[start : start + step]
            yield {a: v[part] for a, v in rows.items()}, columns


def _all_terms(cost_model: CostModel) -> Iterable:
    yield from cost_model.step_terms
    yield from cost_model.microbatch_terms
    yield from cost_model.static_memory_terms
    yield from cost_model.microbatch_memory_terms
    yield cost_model.slots
    yield cost_model.in_flight


def _table(
    space: Space, ctx: TermContext, term, sub, fold: Fold, deadline=None, phases=None, made=None
):
    """``term`` on its keys ``sub`` (``keys_of``); with ``phases`` (a dict) a ``PhasedTerm``'s
    phases are kept there by name and its values are their sum (what its ``evaluate`` gives:
    ``terms.PhasedTerm``), so that ``_phase_parts`` need not evaluate it again. With ``made``
    (a dict) a table on the same keys and axes as one made before reuses its codes and layout
    (``table_like``: the same table as ``table_of`` would make; terms share their keys)."""
    size = len(next(iter(sub.values()))) if sub else 1
    if phases is not None and isinstance(term, PhasedTerm) and size <= CHUNK_CELLS:
        check_deadline(deadline)
        phases[term.name] = term_phases(term, sub, ctx, size)
        values = phases[term.name].total()
    else:
        values = evaluated(term, sub, ctx, size, deadline)
    axes = space.key_axes(term_axes(term, space.domains))
    if made is None:
        return table_of(space, axes, sub, values, fold)
    same = made.get((id(sub), axes))
    if same is not None and same[0] is sub:  # ``same`` holds ``sub``: its id is not reused
        return table_like(same[1], values)
    table = table_of(space, axes, sub, values, fold)
    made[id(sub), axes] = (sub, table)
    return table


def _constant(table: Table) -> Table:
    """A memory table of one finite value everywhere as that value alone (a dense model's
    expert activations: zeros on 18,492 keys of Llama-3 70B under torchtitan ``any``, issue 23):
    its cells are the same at every layout; the keys it lacks are no layout's (every rule that
    left them out is checked on the cells, ``keys_of``), and a layout's memory is read only
    where it is one."""
    values = table.values
    if not table.axes or not len(values) or not np.isfinite(values[0]):
        return table
    if not np.all(values == values[0]):
        return table
    return Table(axes=(), codes=np.zeros(1, dtype=np.int64), values=values[:1].copy())


def _chunk_figures(space: Space, cost_model: CostModel, tables, chunk, fold: Fold, phased=None):
    """Step time, memory, validity and (with ``phased``, else ``None``) exactness of every
    (row, column) cell of a chunk."""

    cache: dict[str, np.ndarray] = {}

    def total(terms) -> np.ndarray:
        out = np.zeros((len(chunk["tp"]), 1))
        for term in terms:
            out = out + gather(space, tables[term.name], chunk, fold, cache)
        return out

    def cells(table: Table) -> np.ndarray:
        return gather(space, table, chunk, fold, cache)

    in_flight = cells(tables[cost_model.in_flight.name])
    exact = None
    if phased is None:
        slots = cells(tables[cost_model.slots.name])
        micro = slots * total(cost_model.microbatch_terms)
    else:
        micro = phased.figures(cells, total(cost_model.microbatch_terms))
        exact = _Exact(space, phased.exact, chunk, fold, cache)
    times = total(cost_model.step_terms) + micro
    memory = total(cost_model.static_memory_terms) + in_flight * total(
        cost_model.microbatch_memory_terms
    )
    shape = (len(chunk["tp"]), len(fold))
    times, memory = np.broadcast_to(times, shape), np.broadcast_to(memory, shape)
    valid = np.isfinite(times) & np.isfinite(memory)
    checks = [rule for rule in space.rules if unsettled(rule, fold)]
    if checks:
        valid &= rule_cells(space, checks, chunk, fold, cache)
    return times, memory, valid, exact


@dataclass(frozen=True, slots=True)
class _Exact:
    """Whether cells' step times are exact (``_Phased.exact``), read only at the cells asked
    for: only the kept layouts need it (issue 23: a gathered matrix per chunk before)."""

    space: Space
    table: Table
    chunk: dict
    fold: Fold
    cache: dict

    def __getitem__(self, cells: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        cells = tuple(np.asarray(x) for x in cells)
        return gather_cells(self.space, self.table, self.chunk, self.fold, self.cache, cells) > 0.5


def _scored(chunk, fold: Fold, figures, cells: np.ndarray) -> list[Scored]:
    """The layouts of ``cells`` (flat indices into the chunk's matrix); each row's axes in
    table order, ``vpp`` last. The cells' values are read as Python numbers at once (element
    by element they cost more than the rest of the reduction: issue 23)."""
    times, memory, exact = figures
    rows, cols = np.divmod(cells, len(fold))
    axes = (*(a for a in GRID_AXES if a != "vpp"), "vpp")
    values = [
        np.asarray(fold.values[a][cols] if a in fold.values else chunk[a][rows])
        .astype(np.int64)
        .tolist()
        for a in axes
    ]
    sure = [True] * len(cells) if exact is None else exact[rows, cols].astype(bool).tolist()
    return [
        Scored(row=dict(zip(axes, row, strict=True)), step_s=t, memory_bytes=m, exact=e)
        for row, t, m, e in zip(
            zip(*values, strict=True),
            times[rows, cols].astype(np.float64).tolist(),
            memory[rows, cols].astype(np.float64).tolist(),
            sure,
            strict=True,
        )
    ]


def scored_order(item: Scored) -> tuple:
    """The search's order of scored layouts: step time to the microsecond, then ``tie_key``."""
    return (item.step_us, tie_key(item.row))


def sorted_scored(items, primary=lambda s: s.step_us) -> list[Scored]:
    """``items`` sorted by ``(primary, tie_key)``, the tie key computed only among equal
    primaries (``sorted(key=scored_order)``'s list when ``primary`` is the step time)."""
    out = sorted(items, key=primary)
    keys = [primary(s) for s in out]
    start = 0
    for end in range(1, len(out) + 1):
        if end == len(out) or keys[end] != keys[start]:
            if end - start > 1:
                out[start:end] = sorted(out[start:end], key=lambda s: tie_key(s.row))
            start = end
    return out


def _reduce(acc: _Acc, chunk, fold, figures, valid, fits, *, top, band, front) -> None:
    times, memory = figures[0], figures[1]
    flat_t = np.where(fits, times, np.inf).ravel()
    if np.isfinite(flat_t).any():
        best_so_far = acc.best[0].step_s if acc.best else np.inf
        # the top rows of this chunk, with every tie of the last one (to the microsecond)
        k = min(top, int(np.isfinite(flat_t).sum()))
        kth = np.partition(flat_t, k - 1)[k - 1]
        last = np.round(kth * US_PER_S)
        if len(acc.best) >= top:  # slower than the kept top-th: _keep_top would drop it
            last = min(last, acc.best[top - 1].step_us)
        picked = np.flatnonzero(np.round(flat_t * US_PER_S) <= last)
        acc.best = sorted_scored(acc.best + _scored(chunk, fold, figures, picked))
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
        acc.front = list(_front(acc.front + _scored(chunk, fold, figures, keep)))


def _tie_rank(chunk, cells: dict[str, np.ndarray]) -> np.ndarray:
    """Each row's place in ``tie_key`` order (the axes in ``cells`` override the chunk's)."""
    ordered = (*FREE_AXES, *(a for a in GRID_AXES if a not in FREE_AXES))
    keys = [AXIS[a].prefer * np.asarray(cells.get(a, chunk.get(a))) for a in ordered]
    rank = np.empty(len(keys[0]), dtype=np.int64)
    rank[np.lexsort(keys[::-1])] = np.arange(len(keys[0]))
    return rank


def _reduce_by_axis(acc: _Acc, chunk, fold: Fold, figures, valid, fits) -> None:
    """The fastest fitting cell (whole microseconds, then ``tie_key``) and the least memory of
    every value of every free axis in this chunk, merged into ``acc`` (a folded axis column by
    column: the columns with one value merge there)."""
    times, memory = figures[0], figures[1]
    n = len(chunk["tp"])
    us = np.where(fits, np.round(times * US_PER_S), np.inf)
    mem = np.where(valid, memory, np.inf)
    col = np.argmin(us, axis=1)  # among a row's ties the first column (tie_key's order)
    row_us = us[np.arange(n), col]
    rank = _tie_rank(chunk, {a: v[col] for a, v in fold.values.items()})
    zero = np.zeros(n, dtype=np.int64)
    rank_x = _tie_rank(chunk, {a: zero for a in fold.axes})  # the column fixed: x order
    for axis in FREE_AXES:
        if axis in fold.axes:
            values = fold.values[axis]
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
    return tuple(sorted_scored(s for s in band_rows if s.step_s <= limit))


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

    forward: Table
    others: tuple[tuple[Table, tuple[Table, ...], float], ...]
    """Per phase beyond the forward: (slots less the forward's, or the paired slots; the terms'
    nonzero parts of it; +1, or -1 for what the pairs hide)."""
    exact: Table

    def figures(self, gather, total: np.ndarray) -> np.ndarray:
        """Each cell's micro-batch part, ``sF * total + (sI - sF) * I + (sW - sF) * W - sP * H``
        (``terms.weighted`` with ``total = F + I + W``); whether it is exact: ``exact``."""
        forward = gather(self.forward)
        micro = forward * total
        for slots, parts, sign in self.others:
            micro = micro + sign * gather(slots) * sum(gather(t) for t in parts)
        return np.where(np.isinf(forward), np.inf, micro)


def _phased_tables(space: Space, ctx: TermContext, cost_model: CostModel, parts, fold, deadline):
    """``_Phased`` when some layout's slots differ by phase or depend on the phase times, else
    ``None`` (every layout is then ``slots * sum of the micro-batch terms``, as for 1F1B);
    ``parts``: each term's keys by name (``score_tables.keys_of``), their tables, and the
    phased terms' phases by name (``_table``).
    Where every slot is ratio-free (1F1B, the combined 1F1B) the reference times change
    nothing: the nominal slots are the slots, and a phase whose slots are the forward's needs
    no table."""
    slots = cost_model.slots
    if not isinstance(slots, PhasedSlots):
        return None
    sub = parts[0][slots.name]
    size = len(next(iter(sub.values()))) if sub else 1
    free = slots_ratio_free(slots, sub, ctx, size)
    if free.all():  # the nominal slots are the slots (where some are not, they are not needed)
        nominal = (FORWARD_SHARE, 1.0 - FORWARD_SHARE, 0.0, 0.0)
        at = slot_phases(slots, sub, ctx, Phases(*(np.full(size, x) for x in nominal)))
        if uniform_slots(at).all():
            return None
    parts, medians = _phase_parts(cost_model, ctx, parts, deadline)
    if not free.all():
        at = slot_phases(slots, sub, ctx, Phases(*(np.full(size, x) for x in medians)))
    forward = table_of(
        space, space.key_axes(term_axes(slots, space.domains)), sub, at.forward, fold
    )
    with np.errstate(invalid="ignore"):
        steps = (at.backward_input - at.forward, at.backward_weight - at.forward, at.paired_hidden)
    others = []
    for step, terms, sign in zip(steps, parts, (1.0, 1.0, -1.0), strict=True):
        step = np.where(np.isfinite(step), step, 0.0)
        if terms and np.any(step != 0):
            tables = tuple(t() for t in terms)
            others.append((table_like(forward, step), tables, sign))
    return _Phased(
        forward=forward, others=tuple(others), exact=table_like(forward, free.astype(np.float64))
    )


def _phase_parts(cost_model: CostModel, ctx: TermContext, tables, deadline):
    """Per phase beyond the forward, the micro-batch terms' nonzero parts of it (each a
    function giving its table, built only where the phase's slots differ), and the sums of the
    terms' median phases (the reference times); ``tables``: as ``_phased_tables``'s ``parts``."""
    keys_of, totals, memo = tables
    parts: list[list] = [[], [], []]
    medians = np.zeros(4)
    for term in cost_model.microbatch_terms:
        keys = keys_of[term.name]
        n = len(next(iter(keys.values()))) if keys else 1
        check_deadline(deadline)
        if not isinstance(term, PhasedTerm):  # FORWARD_SHARE of its total (term_phases)
            total = totals[term.name]
            value = _median(total.values) if len(total.values) else 0.0
            medians += [FORWARD_SHARE * value, (1.0 - FORWARD_SHARE) * value, 0.0, 0.0]
            parts[0].append(functools.partial(scaled, total, 1.0 - FORWARD_SHARE))
            continue
        phases = memo[term.name] if term.name in memo else term_phases(term, keys, ctx, n)
        medians += [_median(part) if n and part.any() else 0.0 for part in phases]
        for i, part in enumerate(phases[1:]):
            if np.any(part != 0):
                parts[i].append(functools.partial(table_like, totals[term.name], part))
    return parts, medians


def _median(values: np.ndarray) -> float:
    """``float(np.median(values))`` of a non-empty 1-D array, by one partition (np.median's
    checks cost more than the partition on a few thousand keys): the middle value, or the mean
    of the two middle ones (``(a + b) / 2``, as ``np.mean`` of two), NaN where one is."""
    size = len(values)
    half = size // 2
    middle = [half - 1, half] if size % 2 == 0 else [half]
    part = np.partition(np.asarray(values, dtype=np.float64), [*middle, size - 1])
    if np.isnan(part[-1]):
        return float("nan")
    if size % 2:
        return float(part[half])
    return float((part[half - 1] + part[half]) / 2)
