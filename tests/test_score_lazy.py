"""The faster paths of scoring a space with the schedule axis (issue 23: torchtitan's ``any``)
against the plain computations they replace: each must give the same values to the bit, so
that the answers do not move."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.api import make_problem
from autopar.base.axes import GRID_AXES, PIPELINE_SCHEDULES
from autopar.costs import score_tables
from autopar.costs.plugin import load_cost_model
from autopar.costs.schedule_orders import chunk_of
from autopar.costs.schedule_slots import in_flight_chunks, ratio_free, schedule_slots
from autopar.costs.score import Scored, _median, _scored
from autopar.costs.score_tables import (
    Keys,
    codes_of,
    column_groups,
    fold_of,
    gather,
    gather_cells,
    key_codes,
    keys_of,
    rule_cells,
    table_like,
    table_of,
    touches,
    unsettled,
)
from autopar.costs.terms import Phases, term_axes
from autopar.inputs.loading import load_model
from autopar.layout.space import build_space
from cost_models.pipeline import PipelineSlots, _rows
from cost_models.shapes import (
    _extreme_stages,
    _held_by_stage,
    _scheduled_peak,
    _stage_kind_counts,
    all_stage_kinds,
    peak_in_flight_stage_bytes,
)


def _grid(seed: int, size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "schedule": rng.integers(0, len(PIPELINE_SCHEDULES), size),
        "pp": rng.choice([1, 2, 4, 8], size),
        "vpp": rng.choice([1, 2, 3], size),
        "grad_accum": rng.choice([4, 8, 16, 64], size),
    }


@pytest.mark.parametrize("seed", range(6))
def test_distinct_shapes_and_ratios_are_np_unique_s(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    size = 500
    grid = _grid(seed, size)
    ratio = rng.choice([0.25, 1 / 3, 0.5, -0.0, 0.0], size)  # -0.0 and 0.0: distinct bits
    other = rng.choice([0.1, 0.2], size)
    constant = np.full(size, 1 / 3)
    rows, where = _rows(grid, ratio, constant, other)
    ints = np.column_stack([grid[a] for a in ("schedule", "pp", "vpp", "grad_accum")])
    every = np.column_stack([ints.astype(np.float64), ratio, constant, other]).view(np.int64)
    unique, inverse = np.unique(every, axis=0, return_inverse=True)
    assert np.array_equal(rows.view(np.int64), unique)
    assert np.array_equal(where, inverse.ravel())
    assert len(rows) > len(np.unique(ints, axis=0))  # the ratios told some rows apart
    plain, plain_where = _rows(grid)
    assert np.array_equal(plain, np.unique(ints, axis=0).astype(np.float64))
    assert np.array_equal(plain[plain_where], ints.astype(np.float64))


def _llama_space(framework: str = "torchtitan"):
    problem = make_problem(
        model="llama-70b",
        gpus=64,
        seq_len=8192,
        global_batch=64,
        framework=framework,
        pipeline_schedule="any",
    )
    return build_space(problem)


def _term_keys(space, name: str):
    """A term of the default cost model by name, its keys (``keys_of``) and key axes."""
    cost_model = load_cost_model(None)
    terms = [
        *cost_model.step_terms,
        *cost_model.microbatch_terms,
        *cost_model.static_memory_terms,
        *cost_model.microbatch_memory_terms,
        cost_model.slots,
        cost_model.in_flight,
    ]
    (term,) = [t for t in terms if t.name == name]
    fold = fold_of(space)
    rows = space.pruned_grid([a for a in GRID_AXES if a not in fold.axes])
    keys = keys_of(space, term, rows, fold)
    return keys, space.key_axes(term_axes(term, space.domains)), fold, rows


@pytest.mark.parametrize(
    "name", ["pipeline_slots", "pp_comm_s", "dense_weights_bytes", "workspace_bytes"]
)
def test_a_table_like_another_is_table_of_on_its_keys(name: str) -> None:
    space = _llama_space()
    keys, axes, fold, _ = _term_keys(space, name)
    size = len(next(iter(keys.values()))) if keys else 1
    rng = np.random.default_rng(0)
    base = table_of(space, axes, keys, rng.random(size), fold)
    values = rng.random(size)
    like, direct = table_like(base, values), table_of(space, axes, keys, values, fold)
    assert like.axes == direct.axes
    assert np.array_equal(like.codes, direct.codes)
    assert np.array_equal(like.values, direct.values)
    assert (like.dense is None) == (direct.dense is None)
    if direct.dense is not None:
        assert np.array_equal(like.dense, direct.dense, equal_nan=True)
    assert not np.array_equal(like.values, base.values)


def test_gathered_cells_are_the_dense_table_s_fancy_index() -> None:
    space = _llama_space()
    keys, axes, fold, rows = _term_keys(space, "pipeline_slots")
    size = len(next(iter(keys.values())))
    table = table_of(space, axes, keys, np.arange(size, dtype=np.float64), fold)
    assert table.dense is not None
    for index, columns in column_groups(space, rows, fold):
        chunk = {a: v[index] for a, v in rows.items()}
        cells = gather(space, table, chunk, columns, {})
        outer = codes_of(space, chunk, tuple(a for a in table.axes if a not in fold.axes))
        folded = tuple(a for a in table.axes if a in fold.axes)
        row = table.outer[outer]
        column = table.column[columns.column_codes(space, folded)]
        expected = table.dense[row[:, None], column[None, :]]
        assert np.array_equal(cells, expected, equal_nan=True)
        assert np.isfinite(cells).any()


def test_rules_checked_together_are_each_rule_checked_alone() -> None:
    space = _llama_space()
    fold = fold_of(space)
    rows = space.pruned_grid([a for a in GRID_AXES if a not in fold.axes])
    checks = [rule for rule in space.rules if unsettled(rule, fold)]
    assert len(checks) >= 2  # torchtitan's schedule rules read grad_accum
    chunk = {a: v[:400] for a, v in rows.items()}
    together = rule_cells(space, checks, chunk, fold, {})
    alone = np.ones_like(together)
    for rule in checks:
        alone &= rule_cells(space, [rule], chunk, fold, {})
    assert np.array_equal(together, alone)
    assert together.any() and not together.all()


def test_column_groups_are_memoised_not_changed() -> None:
    space = _llama_space()
    fold = fold_of(space)
    rows = space.pruned_grid([a for a in GRID_AXES if a not in fold.axes])
    first = list(column_groups(space, rows, fold))
    again = list(column_groups(space, rows, fold))
    assert len(first) == len(again) > 1
    for (index, columns), (index2, columns2) in zip(first, again, strict=True):
        assert np.array_equal(index, index2)
        assert columns2 is columns  # the same Fold: its column codes are shared
    covered = np.sort(np.concatenate([index for index, _ in first]))
    assert np.array_equal(covered, np.unique(covered))  # each row in one group
    assert list(column_groups(space, {a: v[:0] for a, v in rows.items()}, fold)) == []


def test_scored_cells_are_read_as_each_cell_alone() -> None:
    space = _llama_space()
    fold = fold_of(space)
    rows = space.pruned_grid([a for a in GRID_AXES if a not in fold.axes])
    rng = np.random.default_rng(1)
    chunk = {a: v[:50] for a, v in rows.items()}
    shape = (50, len(fold))
    figures = (rng.random(shape), rng.random(shape) * 1e10, rng.random(shape) > 0.5)
    cells = rng.choice(shape[0] * shape[1], 40, replace=False)
    got = _scored(chunk, fold, figures, cells)
    for item, cell in zip(got, cells.tolist(), strict=True):
        r, c = divmod(cell, len(fold))
        row = {
            a: int(fold.values[a][c] if a in fold.values else chunk[a][r])
            for a in GRID_AXES
            if a != "vpp"
        }
        row["vpp"] = int(fold.values["vpp"][c])
        expected = Scored(
            row=row,
            step_s=float(figures[0][r, c]),
            memory_bytes=float(figures[1][r, c]),
            exact=bool(figures[2][r, c]),
        )
        assert item == expected
        assert list(item.row) == list(expected.row)
    assert _scored(chunk, fold, (*figures[:2], None), cells[:3])[0].exact is True
    assert _scored(chunk, fold, figures, cells[:0]) == []


def _peak_by_shape(model, columns, kind_bytes, extras) -> np.ndarray:
    """``_scheduled_peak`` as it was written before: one matrix product per distinct shape,
    on that shape's rows gathered."""
    schedule, pp, vpp, m = columns
    extra, last_extra = extras
    kinds = tuple(sorted({*model.layer_kinds, model.mtp_layer_kind}))
    per_kind = np.stack([kind_bytes(k) for k in kinds])
    out = np.zeros(len(pp))
    shapes = np.column_stack(columns)
    for code, p, v, g in np.unique(shapes, axis=0).tolist():
        rows = np.flatnonzero(np.all(shapes == (code, p, v, g), axis=1))
        name = PIPELINE_SCHEDULES[code]
        held = in_flight_chunks(name, p, v, g)
        weights = _held_by_stage(name, p, v, g)
        totals = (weights @ _stage_kind_counts(model, p * v, kinds)) @ per_kind[:, rows]
        totals[0] = totals[0] + extra[rows] * held[0][0]
        rank, chunk = chunk_of(name, p, v, p * v - 1)
        totals[rank] = totals[rank] + last_extra[rows] * held[rank][chunk]
        out[rows] = totals.max(axis=0) / max(sum(held[0]) / v, 1e-30)
    return out


@pytest.mark.parametrize("name", ["llama-70b", "deepseek-v3"])
def test_the_scheduled_peak_is_each_shape_s_product(name: str) -> None:
    model = load_model(name)
    rng = np.random.default_rng(7)
    shapes = [
        (s, p, v, m)
        for s in ("zb-h1", "zb-v", "dualpipe-v", "gpipe", "looped-bfs")
        for p, v, m in ((2, 2, 8), (4, 2, 16), (4, 1, 8), (2, 1, 4), (1, 1, 4), (8, 2, 16))
        if (v == 2) == (s in ("zb-v", "dualpipe-v")) or s in ("zb-h1", "looped-bfs")
    ]
    pick = rng.integers(0, len(shapes), 300)
    columns = [
        np.array([PIPELINE_SCHEDULES.index(shapes[i][0]) for i in pick]),
        *(np.array([shapes[i][k] for i in pick]) for k in (1, 2, 3)),
    ]
    kinds = sorted({*model.layer_kinds, model.mtp_layer_kind})
    per_kind = {k: rng.random(300) * 1e9 * (rng.random(300) > 0.1) for k in kinds}  # some 0
    extras = (rng.random(300) * 1e8, rng.random(300) * 1e8)
    got = _scheduled_peak(model, columns, lambda k: per_kind[k], extras)
    expected = _peak_by_shape(model, columns, lambda k: per_kind[k], extras)
    assert np.array_equal(got, expected)
    assert np.all(got > 0)


def _one_f_one_b_by_stage(model, pp, kind_bytes, extra) -> np.ndarray:
    """The 1F1B peak over every stage, as it was written before."""
    out = np.zeros(len(pp))
    for value in np.unique(pp):
        rows = pp == value
        stages = int(value)
        peak = np.zeros(int(rows.sum()))
        kinds_of = all_stage_kinds(model, stages)
        for i in range(stages):
            total = extra[rows] if i == 0 else np.zeros(int(rows.sum()))
            for kind, count in kinds_of[i].items():
                total = total + count * kind_bytes(kind)[rows]
            peak = np.maximum(peak, total * (stages - i) / stages)
        out[rows] = peak
    return out


@pytest.mark.parametrize("name", ["llama-70b", "deepseek-v3"])
def test_the_one_f_one_b_peak_reads_the_end_stages_only(name: str) -> None:
    model = load_model(name)
    rng = np.random.default_rng(11)
    size = 400
    pp = rng.choice([1, 2, 3, 4, 5, 7, 8, 16, 20], size)
    kinds = sorted({*model.layer_kinds, model.mtp_layer_kind})
    per_kind = {k: rng.random(size) * 1e9 for k in kinds}
    extra = rng.random(size) * 1e9  # large: stage 0 often the peak, not always
    got = peak_in_flight_stage_bytes(model, pp, lambda k: per_kind[k], first_stage_extra=extra)
    expected = _one_f_one_b_by_stage(model, pp, lambda k: per_kind[k], extra)
    assert np.array_equal(got, expected)
    assert len(_extreme_stages(model, 16)) < 16
    none = peak_in_flight_stage_bytes(model, pp[:0], lambda k: per_kind[k][:0])
    assert none.shape == (0,)


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("name", ["pipeline_slots", "dp_comm_s", "workspace_bytes"])
def test_cells_read_alone_are_the_gathered_matrix_s(monkeypatch, name: str, dense: bool) -> None:
    if not dense:
        monkeypatch.setattr(score_tables, "DENSE_CODES", 1)
    space = _llama_space()
    keys, axes, fold, rows = _term_keys(space, name)
    size = len(next(iter(keys.values()))) if keys else 1
    table = table_of(space, axes, keys, np.arange(1, size + 1, dtype=np.float64), fold)
    assert (table.dense is not None) == dense or not axes
    rng = np.random.default_rng(3)
    for index, columns in column_groups(space, rows, fold):
        chunk = {a: v[index] for a, v in rows.items()}
        matrix = np.broadcast_to(
            gather(space, table, chunk, columns, {}), (len(index), len(columns))
        )
        cells = (rng.integers(0, len(index), 50), rng.integers(0, len(columns), 50))
        alone = gather_cells(space, table, chunk, columns, {}, cells)
        assert np.array_equal(alone, matrix[cells], equal_nan=True)


@pytest.mark.parametrize("constant", [True, False])
def test_phase_slots_are_each_row_s_schedule_slots(constant: bool) -> None:
    rng = np.random.default_rng(5)
    size = 300
    grid = _grid(21, size)
    shares = rng.random((4, size)) if not constant else np.tile([[0.3], [0.4], [0.2], [0.1]], size)
    got = PipelineSlots().phase_slots(grid, None, Phases(*shares))
    total = np.maximum(shares[:3].sum(axis=0), 1e-30)
    for i in range(size):
        name = PIPELINE_SCHEDULES[int(grid["schedule"][i])]
        shape = (int(grid["pp"][i]), int(grid["vpp"][i]), int(grid["grad_accum"][i]))
        free = ratio_free(name, *shape)
        ratio = (1 / 3, 1 - 1 / 3, 0.0, 0.0) if free else tuple((shares[:, i] / total[i]).tolist())
        expected = schedule_slots(name, *shape, ratio)
        assert tuple(float(x[i]) for x in got) == expected
    assert not all(ratio_free(PIPELINE_SCHEDULES[int(s)], 2, 2, 8) for s in grid["schedule"])


@pytest.mark.parametrize("name", ["layer_activations_bytes", "pipeline_slots", "pp_comm_s"])
def test_crossed_keys_codes_are_their_values_codes(name: str) -> None:
    space = _llama_space()
    keys, axes, fold, _ = _term_keys(space, name)
    assert isinstance(keys, Keys)
    plain = dict(keys)
    outer = tuple(a for a in axes if a not in fold.axes)
    folded = tuple(a for a in fold.axes if a in axes)
    for part in (outer, folded, axes, outer[:2]):
        assert np.array_equal(key_codes(space, keys, part), codes_of(space, plain, part))
    assert len(np.unique(key_codes(space, keys, axes))) == len(plain["tp"])  # distinct keys


@pytest.mark.parametrize("size", [1, 2, 3, 10, 11, 3000, 3001])
def test_the_median_is_numpy_s(size: int) -> None:
    rng = np.random.default_rng(size)
    for values in (
        rng.random(size),
        rng.choice([0.0, 1.5, 2.25], size),
        np.where(rng.random(size) < 0.1, np.nan, rng.random(size)),
        np.broadcast_to(0.7, (size,)),
    ):
        expected = float(np.median(values))
        got = _median(values)
        assert (np.isnan(got) and np.isnan(expected)) or got == expected


@pytest.mark.parametrize("framework", ["torchtitan", "megatron"])
def test_each_group_s_columns_are_its_rules_on_every_column(framework: str) -> None:
    space = _llama_space(framework)
    fold = fold_of(space)
    rows = space.pruned_grid([a for a in GRID_AXES if a not in fold.axes])
    groups = list(column_groups(space, rows, fold))
    group = groups[0][1].settled
    rules = [r for r in space.rules if touches(r, fold) and set(r.axes) <= {*group, *fold.axes}]
    assert any(set(r.axes) == {"pp", "vpp"} for r in rules)
    seen = 0
    for index, columns in groups:
        for i in index[:: max(1, len(index) // 7)].tolist():
            cells = {a: np.full(len(fold), rows[a][i]) for a in group}
            cells.update(fold.values)
            keep = np.ones(len(fold), dtype=bool)
            for rule in rules:
                keep &= np.asarray(rule.check(cells), dtype=bool)
            expected = {a: v[keep] for a, v in fold.values.items()}
            assert all(np.array_equal(columns.values[a], expected[a]) for a in fold.axes)
            seen += 1
    assert seen > len(groups)
