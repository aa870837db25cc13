"""The tables ``autopar.costs.score`` joins: each term on its own key axes, looked up by a
mixed-radix code, and the folded axes (``Fold``) that become the columns of the scored matrix.

The folded axes are the virtual-stage count and, when more than one schedule is searched, the
pipeline schedule: the rows are the layouts of every other axis, each with one column per
(vpp, schedule) pair the rules over those two allow, so a schedule is scored as a column of the
same row (the terms that do not read it are gathered once per row) rather than as a copy of
every row (issue 23: combined-1f1b doubled the rows of every EP > 1 layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autopar.base.axes import AXIS
from autopar.base.deadline import check_deadline
from autopar.costs.terms import TermContext, term_axes
from autopar.layout.space import DERIVED, Space

FOLD_AXES = ("vpp", "schedule")
"""The axes that may be folded into columns, in table (and tie) order."""
CHUNK_CELLS = 1 << 20
"""Layout cells (rows x columns) scored at once: about 40 MB of arrays."""
DENSE_CODES = 1 << 22
"""A table whose key codes span at most this many values is looked up by index (32 MB)."""


@dataclass(frozen=True, slots=True)
class Fold:
    """The columns of the scored matrix: per folded axis, its value in each column, the
    columns in ``tie_key`` order (so the first of a row's tied cells is the preferred one)."""

    axes: tuple[str, ...]
    values: dict[str, np.ndarray]
    settled: tuple[str, ...] = ()
    """Axes every row scored with these columns shares (``column_groups``): the rules over
    them and the folded axes alone were checked in choosing the columns."""
    codes: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict)
    """Memo: each column's mixed-radix code over some of ``axes`` (``column_codes``)."""
    kept: dict[tuple, bytes] = field(default_factory=dict)
    """Memo: the columns the rules allow a group of rows, by the group's values
    (``column_groups``, asked once per term's keys and once for the rows)."""
    parts: dict[tuple, object] = field(default_factory=dict)
    """Memo of ``column_groups``: by the group's axes, the rules it checks; by those and a
    mask of columns, the ``Fold`` of them (whose own memos are then shared by every caller)."""

    def __len__(self) -> int:
        return len(self.values[self.axes[0]])

    def column_codes(self, space: Space, axes: tuple[str, ...]) -> np.ndarray:
        if axes not in self.codes:
            self.codes[axes] = codes_of(space, self.values, axes)
        return self.codes[axes]


def fold_of(space: Space) -> Fold:
    """The folded axes of ``space``: ``vpp``, and ``schedule`` when several are searched; the
    columns are the pairs the rules over them alone allow (``gpipe`` at ``vpp == 1``, ...)."""
    axes = tuple(a for a in FOLD_AXES if a == "vpp" or len(space.domains.get(a, ())) > 1)
    grid = space.pruned_grid(axes)
    keys = [AXIS[a].prefer * np.asarray(grid[a]) for a in axes]
    order = np.lexsort(keys[::-1])
    return Fold(axes=axes, values={a: np.asarray(grid[a], dtype=np.int64)[order] for a in axes})


def touches(rule, fold: Fold) -> bool:
    """Whether ``rule`` reads a folded axis (it is then checked per cell, not per row)."""
    return any(a in fold.axes for a in rule.axes)


def unsettled(rule, fold: Fold) -> bool:
    """Whether ``rule`` is left to check per cell: it reads a folded axis and an axis the
    columns were not chosen for."""
    return touches(rule, fold) and not set(rule.axes) <= {*fold.settled, *fold.axes}


@dataclass(slots=True)
class Table:
    """One term's values on its own key axes, indexed by key code (dense when the code space is
    small, else sorted codes searched); the folded axes come last. Dense, the table is a matrix
    of one row per distinct key of the outer (unfolded) axes by one column per distinct key of
    the folded ones, each plus a last one of NaN; ``outer`` gives each outer code its row and
    ``column`` each folded code its column: the keys of a term over the schedule and vpp are a
    few thousand, their full code space millions (issue 23: filling those was a tenth of a
    torchtitan ``any`` solve)."""

    axes: tuple[str, ...]
    codes: np.ndarray
    values: np.ndarray
    dense: np.ndarray | None = None
    outer: np.ndarray | None = None
    column: np.ndarray | None = None
    layout: tuple[np.ndarray, np.ndarray] | np.ndarray | None = None
    """Where each of the keys ``table_of`` was given sits: its (row, column) of ``dense``, else
    its place among the sorted ``codes`` (``table_like``)."""


def radix(space: Space, axis: str) -> int:
    return len(space.domains[axis]) + 1


def index_of(space: Space, grid, axis: str, cache: dict | None = None):
    """Position of each row's value in the axis's domain (memoised per chunk in ``cache``)."""
    if cache is not None and axis in cache:
        return cache[axis]
    domain = np.array(space.domains[axis], dtype=np.int64)
    index = np.searchsorted(domain, grid[axis])
    if cache is not None:
        cache[axis] = index
    return index


def codes_of(space: Space, grid, axes: tuple[str, ...], cache=None):
    """Mixed-radix code of each row over ``axes`` (index of its value in each domain)."""
    code = np.zeros(len(grid[axes[0]]), dtype=np.int64)
    for axis in axes:
        code = code * radix(space, axis) + index_of(space, grid, axis, cache)
    return code


class Keys(dict):
    """A term's keys crossed with the folded columns (``_axes_keys``): axis -> values, which
    also knows them as its distinct outer keys taken by ``take`` and its columns' codes, so the
    codes of its tables are the outer keys' codes taken, not the crossed keys' (issue 23)."""

    __slots__ = ("columns", "memo", "outer", "take")


def key_codes(space: Space, keys, axes: tuple[str, ...]) -> np.ndarray:
    """``codes_of(space, keys, axes)``, from the outer keys or the columns of ``Keys``."""
    if not isinstance(keys, Keys):
        return codes_of(space, keys, axes)
    if axes not in keys.memo:
        if set(axes) <= set(keys.outer):
            keys.memo[axes] = codes_of(space, keys.outer, axes)[keys.take]
        elif set(axes) <= set(keys.columns[1]):
            code, columns = keys.columns
            keys.memo[axes] = codes_of(space, columns, axes)[code]
        else:
            keys.memo[axes] = codes_of(space, keys, axes)
    return keys.memo[axes]


def table_of(space: Space, axes: tuple[str, ...], sub, values, fold: Fold) -> Table:
    """A table of ``values`` on the keys ``sub`` over ``axes``."""
    values = np.asarray(values, dtype=np.float64)
    if not axes:
        return Table(axes=(), codes=np.zeros(1, dtype=np.int64), values=values[:1].copy())
    outer = tuple(a for a in axes if a not in fold.axes)
    folded = tuple(a for a in fold.axes if a in axes)
    ordered = (*outer, *folded)
    outer_span = int(np.prod([radix(space, a) for a in outer]))
    fold_span = int(np.prod([radix(space, a) for a in folded]))
    size = len(values)
    outer_code = key_codes(space, sub, outer) if outer else np.zeros(size, dtype=np.int64)
    fold_code = key_codes(space, sub, folded) if folded else np.zeros(size, dtype=np.int64)
    codes = outer_code * fold_span + fold_code  # codes_of over ``ordered`` (mixed radix)
    if outer_span <= DENSE_CODES:
        index, rows = _compact(outer_code, outer_span)
        column, columns = _compact(fold_code, fold_span)
        if (rows + 1) * (columns + 1) <= DENSE_CODES:
            dense = np.full((rows + 1, columns + 1), np.nan)
            cells = (index[outer_code], column[fold_code])
            dense[cells] = values
            return Table(
                ordered, codes, values, dense=dense, outer=index, column=column, layout=cells
            )
    order = np.argsort(codes, kind="stable")
    return Table(axes=ordered, codes=codes[order], values=values[order], layout=order)


def table_like(table: Table, values) -> Table:
    """``table_of`` of ``values`` on the keys and axes ``table`` was made of, its codes and
    layout reused (a term's phases and a schedule's slots per phase: issue 23)."""
    values = np.asarray(values, dtype=np.float64)
    if not table.axes:
        return Table(axes=(), codes=table.codes, values=values[:1].copy())
    if table.dense is None:
        return Table(table.axes, table.codes, values[table.layout], layout=table.layout)
    dense = np.full(table.dense.shape, np.nan)
    dense[table.layout] = values
    return Table(
        table.axes,
        table.codes,
        values,
        dense=dense,
        outer=table.outer,
        column=table.column,
        layout=table.layout,
    )


def _compact(code: np.ndarray, span: int) -> tuple[np.ndarray, int]:
    """Each code of ``range(span)`` its place among the distinct ``code`` (absent: the count of
    them, a last place), and that count."""
    present = np.zeros(span, dtype=bool)
    present[code] = True
    count = int(present.sum())
    index = np.full(span, count, dtype=np.int64)
    index[present] = np.arange(count)
    return index, count


def scaled(table: Table, factor: float) -> Table:
    """``table`` with every value times ``factor``."""
    dense = None if table.dense is None else table.dense * factor
    return Table(
        axes=table.axes,
        codes=table.codes,
        values=table.values * factor,
        dense=dense,
        outer=table.outer,
        column=table.column,
        layout=table.layout,
    )


def keys_of(space: Space, term, rows, fold: Fold, cache=None, index=None):
    """The term's keys that some row of the space has: its axes' distinct combinations among
    ``rows`` (with the derived columns they fix), crossed with the columns' values of the
    folded axes it reads, less the cells its rules over those forbid; the same keys as
    ``Space.pruned_grid(term.depends_on)`` restricted to the space's layouts, so a term is never
    evaluated on keys no layout has (Mixtral on 997,920 GPUs: 2.0 M keys of its own, 0.4 M rows).
    Terms over the same axes share their keys (``cache``, by axes), and every term the rows'
    places in the domains (``index``, by axis: ``index_of``'s memo)."""
    free = tuple(space.free_axes(term_axes(term, space.domains)))
    if cache is None:
        return _axes_keys(space, free, rows, fold, index)
    if free not in cache:
        cache[free] = _axes_keys(space, free, rows, fold, index)
    return cache[free]


def _axes_keys(space: Space, free: tuple[str, ...], rows, fold: Fold, index=None):
    outer = [a for a in free if a not in fold.axes]
    folded = tuple(a for a in fold.axes if a in free)
    if not free:
        return {}
    if outer:
        first = _first_rows(codes_of(space, rows, tuple(outer), index), _span(space, outer))
        derived = [a for a in DERIVED if a in rows and set(space.free_axes([a])) <= set(outer)]
        sub = {a: rows[a][first] for a in (*outer, *derived)}
    else:
        sub = {}
    if not folded:
        return sub
    taken: list[np.ndarray] = []
    values: dict[str, list[np.ndarray]] = {a: [] for a in folded}
    places: list[np.ndarray] = []  # each crossed key's column among ``distinct``
    distinct: dict[str, list[np.ndarray]] = {a: [] for a in folded}
    settled, count = fold, 0
    groups = column_groups(space, sub, fold) if sub else [(np.zeros(1, dtype=np.int64), fold)]
    for index, columns in groups:  # each key crossed with its group's columns
        _, first_column = np.unique(columns.column_codes(space, folded), return_index=True)
        taken.append(np.repeat(index, len(first_column)))
        places.append(np.tile(np.arange(count, count + len(first_column)), len(index)))
        count += len(first_column)
        for a in folded:
            distinct[a].append(columns.values[a][first_column])
            values[a].append(np.tile(columns.values[a][first_column], len(index)))
        settled = columns  # every group is settled on the same axes
    empty = np.zeros(0, dtype=np.int64)  # no group has a column: no key, every axis present
    take = np.concatenate(taken) if taken else empty
    place = np.concatenate(places) if places else empty
    crossed = {a: np.concatenate(v) if v else empty for a, v in values.items()}
    columns_of = {a: np.concatenate(v) if v else empty for a, v in distinct.items()}
    present = {*sub, *crossed}
    checks = [r for r in space.rules if unsettled(r, settled) and set(r.axes) <= present]
    if checks:  # the rules see their own axes; the other axes are gathered once, kept keys only
        read = dict.fromkeys(a for r in checks for a in r.axes)
        seen = {a: crossed[a] if a in crossed else sub[a].take(take) for a in read}
        keep = np.ones(len(take), dtype=bool)
        for rule in checks:
            keep &= rule.check(seen)
        take, place = take[keep], place[keep]
        crossed = {a: v[keep] for a, v in crossed.items()}
    keys = Keys({**{a: v.take(take) for a, v in sub.items()}, **crossed})
    keys.outer, keys.take, keys.columns, keys.memo = sub, take, (place, columns_of), {}
    return keys


def _span(space: Space, axes) -> int:
    return int(np.prod([radix(space, a) for a in axes]))


def _first_rows(code: np.ndarray, span: int) -> np.ndarray:
    """``np.unique(code, return_index=True)[1]``: the first row of each distinct code, in code
    order; by a mark per code where the codes span at most four times the rows (the sort that
    ``np.unique`` needs for ``return_index`` is the larger cost there)."""
    if span > 4 * len(code):
        return np.unique(code, return_index=True)[1]
    first = np.full(span, -1, dtype=np.int64)
    first[code[::-1]] = np.arange(len(code) - 1, -1, -1)  # the last write, the first row, stays
    return first[first >= 0]


def evaluated(term, sub, ctx: TermContext, size: int, deadline):
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


def gather(space: Space, table: Table, chunk, fold: Fold, cache: dict):
    """The table's value on every row (a column) or every (row, column) cell (a matrix); NaN
    where the table has no such key (a combination the rules forbid)."""
    if not table.axes:
        return table.values[0]
    folded = tuple(a for a in table.axes if a in fold.axes)
    outer = table.axes[: len(table.axes) - len(folded)]
    code = _outer_codes(space, chunk, outer, cache)
    if table.dense is not None:
        row = table.outer[code]
        if not folded:
            return table.dense[row, 0][:, None]
        column = table.column[fold.column_codes(space, folded)]
        # two takes, the smaller copy first (a 2-D fancy index cost 2-3x more: issue 23)
        if len(row) * table.dense.shape[1] <= table.dense.shape[0] * len(column):
            return table.dense.take(row, axis=0).take(column, axis=1)
        return table.dense.take(column, axis=1).take(row, axis=0)
    if folded:
        span = int(np.prod([radix(space, a) for a in folded]))
        code = code[:, None] * span + fold.column_codes(space, folded)[None, :]
    pos = np.minimum(np.searchsorted(table.codes, code), len(table.codes) - 1)
    out = np.where(table.codes[pos] == code, table.values[pos], np.nan)
    return out if folded else out[:, None]


def _outer_codes(space: Space, chunk, outer: tuple[str, ...], cache: dict) -> np.ndarray:
    """The chunk's codes over ``outer``, computed once per axes (cached by a tuple key)."""
    if not outer:
        return np.zeros(len(next(iter(chunk.values()))), dtype=np.int64)
    if (outer,) not in cache:
        cache[outer,] = codes_of(space, chunk, outer, cache)
    return cache[outer,]


def gather_cells(space: Space, table: Table, chunk, fold: Fold, cache: dict, cells):
    """``gather(...)[rows, cols]`` for ``cells = (rows, cols)``, read at those cells only."""
    rows, cols = cells
    if not table.axes:
        return np.full(len(rows), table.values[0])
    folded = tuple(a for a in table.axes if a in fold.axes)
    outer = table.axes[: len(table.axes) - len(folded)]
    code = _outer_codes(space, chunk, outer, cache)[rows]
    columns = fold.column_codes(space, folded)[cols] if folded else np.zeros(len(rows), int)
    if table.dense is not None:
        column = table.column[columns] if folded else columns
        return table.dense[table.outer[code], column]
    if folded:
        code = code * int(np.prod([radix(space, a) for a in folded])) + columns
    pos = np.minimum(np.searchsorted(table.codes, code), len(table.codes) - 1)
    return np.where(table.codes[pos] == code, table.values[pos], np.nan)


def rule_cells(space: Space, rules, chunk, fold: Fold, cache: dict) -> np.ndarray:
    """Rules over a folded axis on every (row, column) cell, all of them: those that read the
    same other axes checked together, once per distinct combination of those (torchtitan's
    five schedule rules all read pp and grad_accum: one expansion onto the cells, not five)."""
    by_others: dict[tuple[str, ...], list] = {}
    for rule in rules:
        others = tuple(sorted(a for a in rule.axes if a not in fold.axes))
        by_others.setdefault(others, []).append(rule)
    rows = len(next(iter(chunk.values())))
    valid = np.ones((rows, len(fold)), dtype=bool)
    for others, same in by_others.items():
        if others:
            _, first, inverse = np.unique(
                codes_of(space, chunk, others, cache), return_index=True, return_inverse=True
            )
        else:
            first, inverse = np.zeros(1, dtype=np.int64), np.zeros(rows, dtype=np.int64)
        combos = {a: np.repeat(chunk[a][first], len(fold)) for a in others}
        combos.update({a: np.tile(v, len(first)) for a, v in fold.values.items()})
        ok = np.ones(len(first) * len(fold), dtype=bool)
        for rule in same:
            ok &= np.asarray(rule.check(combos), dtype=bool)
        valid &= ok.reshape(len(first), len(fold))[inverse.ravel()]
    return valid


GROUP_AXES = ("pp", "ep", "recompute")
"""The rows are scored in groups of one value of these, each with only the columns the rules
over them and the folded axes allow it (one pipeline depth admits few virtual-stage counts,
an EP = 1 layout no combined 1F1B, and where the combined 1F1B runs 1F1B is not searched):
DeepSeek-V3 on 2048 H100 has 17% of its (row, vpp, schedule) cells valid."""


def column_groups(space: Space, rows, fold: Fold):
    """``(row indices, columns)`` per group of rows (``GROUP_AXES``; groups that the rules
    leave the same columns are one, in the rows' order within each), the columns a ``Fold`` of
    those the group's rules allow; groups left no column are left out (they have no layout)."""
    group = tuple(a for a in GROUP_AXES if a in rows and a not in fold.axes)
    count = len(next(iter(rows.values())))
    if not group:
        yield np.arange(count), fold
        return
    if not count:  # no row: no group
        return
    code = codes_of(space, rows, group)
    order = np.argsort(code, kind="stable")
    ranked = code[order]
    starts = np.flatnonzero(np.concatenate([[True], ranked[1:] != ranked[:-1]])).tolist()
    ends = (*starts[1:], count)
    if group not in fold.parts:
        fold.parts[group] = [
            r for r in space.rules if touches(r, fold) and set(r.axes) <= {*group, *fold.axes}
        ]
    rules = fold.parts[group]
    firsts = order[starts]
    memos = list(zip(*(rows[a][firsts].tolist() for a in group), strict=True))
    _kept(space, fold, (group, rules), {a: rows[a][firsts] for a in group}, memos)
    merged: dict[bytes, list[np.ndarray]] = {}  # groups with the same columns scored together
    for start, end, memo in zip(starts, ends, memos, strict=True):
        if fold.kept[group, *memo]:
            merged.setdefault(fold.kept[group, *memo], []).append(order[start:end])
    for mask, parts in merged.items():
        yield np.concatenate(parts), _part(fold, group, mask)


def _kept(space: Space, fold: Fold, checks, values, memos) -> None:
    """``fold.kept`` of each group of ``values`` (its axes' values, one a group) not yet there:
    the rules over the group's axes and the folded ones (``checks``: the group's axes and
    those rules) checked on every (group, column) cell at once, not group by group (issue 23:
    a solve builds its ``Fold`` anew), and each rule once per distinct combination of its
    axes' values among the cells (the layer-split rules read pp and vpp alone: a few hundred
    of the thousands of (group, vpp, schedule) cells)."""
    group, rules = checks
    new = [i for i, memo in enumerate(memos) if (group, *memo) not in fold.kept]
    if not new:
        return
    cells = {a: np.repeat(v[new], len(fold)) for a, v in values.items()}
    cells.update({a: np.tile(v, len(new)) for a, v in fold.values.items()})
    keep = np.ones(len(new) * len(fold), dtype=bool)
    by_axes: dict[tuple[str, ...], list] = {}
    for rule in rules:
        by_axes.setdefault(tuple(sorted(rule.axes)), []).append(rule)
    for axes, same in by_axes.items():
        code = codes_of(space, cells, axes) if axes else np.zeros(len(keep), dtype=np.int64)
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        distinct = {a: v[first] for a, v in cells.items()}
        ok = np.ones(len(first), dtype=bool)
        for rule in same:
            ok &= np.asarray(rule.check(distinct), dtype=bool)
        keep &= ok[inverse.ravel()]
    for i, kept in zip(new, keep.reshape(len(new), len(fold)), strict=True):
        fold.kept[group, *memos[i]] = np.packbits(kept).tobytes() if kept.any() else b""


def _part(fold: Fold, group: tuple[str, ...], mask: bytes) -> Fold:
    """The ``Fold`` of the columns ``mask`` keeps, settled on ``group`` (memoised)."""
    if (group, mask) not in fold.parts:
        keep = np.unpackbits(np.frombuffer(mask, dtype=np.uint8))[: len(fold)].astype(bool)
        values = {a: v[keep] for a, v in fold.values.items()}
        fold.parts[group, mask] = Fold(axes=fold.axes, values=values, settled=group)
    return fold.parts[group, mask]
