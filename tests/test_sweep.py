"""``autopar.sweeps.run`` and ``autopar sweep``."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from typer.testing import CliRunner

import autopar
from autopar import api
from autopar.cli import app
from autopar.layout.results import SolveResult
from autopar.sweeps.run import COLUMNS, SweepResult

FRAME_COLUMNS = [
    "gpus", "gpu", "seq_len", "status", "tp", "pp", "dp", "cp", "ep", "etp", "vpp",
    "pipeline_schedule", "mbs", "grad_accum", "recompute", "zero", "sequence_parallel",
    "step_time_s", "step_time_low_s",
    "step_time_high_s", "error_band_pct", "error_band_runs", "tokens_per_s",
    "tokens_per_s_per_gpu", "mfu", "memory_gib", "days_to_train", "cost", "goodput",
    "checkpoint_interval_s", "interruptions_per_day", "days_to_train_failure_free",
    "cost_failure_free", "reason",
]  # fmt: skip


@pytest.fixture(scope="module")
def swept():
    calls = []
    result = autopar.sweep(
        model="llama-8b",
        gpus=[8, 16, 32, 64],
        seq_len=4096,
        global_batch=256,
        pp=1,  # pinned to keep the solves fast; TP, CP, DP, mbs, recompute, ZeRO stay free
        train_tokens=1e12,
        gpu_hour_cost=2.5,
        progress=lambda done, total, row: calls.append((done, total, row.gpus)),
    )
    return result, calls


def test_frame_columns_and_rows(swept):
    result, _ = swept
    assert isinstance(result, SweepResult)
    frame = result.to_frame()
    assert list(frame.columns) == FRAME_COLUMNS == list(COLUMNS)
    assert list(frame["gpus"]) == [8, 16, 32, 64]
    assert (frame["status"] == "optimal").all()
    assert (frame["tp"] * frame["pp"] * frame["cp"] * frame["dp"] == frame["gpus"]).all()


def test_more_gpus_more_throughput(swept):
    frame = swept[0].to_frame()
    assert frame["tokens_per_s"].is_monotonic_increasing
    assert frame["days_to_train"].is_monotonic_decreasing
    assert ((frame["mfu"] > 0.2) & (frame["mfu"] < 1)).all()
    # cost = gpu-hours x price, days = tokens / throughput; with failures, / goodput
    first = frame.iloc[0]
    free = 1e12 / first["tokens_per_s"] / 86400
    assert first["days_to_train_failure_free"] == pytest.approx(free)
    assert first["days_to_train"] == pytest.approx(free / first["goodput"])
    assert 0.9 < first["goodput"] < 1
    assert first["cost"] == pytest.approx(8 * first["days_to_train"] * 24 * 2.5)
    assert first["cost_failure_free"] == pytest.approx(8 * free * 24 * 2.5)
    assert first["interruptions_per_day"] == pytest.approx(8 * 24 / 50_677.0, rel=1e-4)


def test_progress_and_to_dict(swept):
    result, calls = swept
    assert calls == [(1, 4, 8), (2, 4, 16), (3, 4, 32), (4, 4, 64)]
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert data["columns"] == FRAME_COLUMNS and len(data["rows"]) == 4


def test_result_is_frozen(swept):
    with pytest.raises(AttributeError):
        swept[0].rows = ()


def test_infeasible_point_is_a_row():
    # 70B on 8 GPUs with TP=8 pinned cannot fit: a NaN row, not an exception
    result = autopar.sweep(
        model="llama-70b", gpus=8, global_batch=64, tp=8, pp=1, recompute="full", train_tokens=1e9
    )
    (row,) = result.rows
    assert row.status == "infeasible"
    assert math.isnan(row.step_time_s) and math.isnan(row.days_to_train)
    assert result.to_dict()["rows"][0]["step_time_s"] is None


def test_grid_over_gpu_types_and_seq_lens(monkeypatch):
    seen = []

    def fake_solve(**kw):
        seen.append((kw["gpu"], kw["seq_len"], kw["gpus"], kw["top"]))
        return SolveResult(status="unknown", solve_time_s=0.0, layouts=())

    monkeypatch.setattr(api, "solve", fake_solve)
    result = autopar.sweep(model="llama-8b", gpus=[8, 16], gpu=["h100", "h200"], seq_len=[2, 4])
    assert len(result.rows) == 8 and {r.status for r in result.rows} == {"unknown"}
    assert seen[0] == ("h100", 2, 8, 1) and seen[-1] == ("h200", 4, 16, 1)
    assert {r.gpu for r in result.rows} == {"h100", "h200"}


def test_bad_api_values():
    with pytest.raises(autopar.InputError, match="--gpus"):
        autopar.sweep(model="llama-8b", gpus=[8, 0])
    with pytest.raises(autopar.InputError, match="--train-tokens"):
        autopar.sweep(model="llama-8b", gpus=8, train_tokens=-1)


def run(*args: str):
    return CliRunner().invoke(app, ["sweep", "--model", "llama-8b", *args])


def test_cli_csv_and_progress():
    result = run("--gpus", "8,16", "--global-batch", "256", "--format", "csv", "--time-limit", "5",
                 "--train-tokens", "15e12", "--gpu-hour-cost", "2.5")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["gpus"] for r in rows] == ["8", "16"]
    assert list(rows[0]) == FRAME_COLUMNS
    assert float(rows[0]["cost"]) > 0
    assert "[1/2] gpus=8" in result.stderr and "[2/2] gpus=16" in result.stderr


def test_cli_table_and_json():
    table = run("--gpus", "8", "--global-batch", "256")
    assert table.exit_code == 0, table.output
    assert "tok/s/GPU" in table.stdout and "optimal" in table.stdout
    as_json = run("--gpus", "8", "--global-batch", "256", "--format", "json")
    assert json.loads(as_json.stdout)["rows"][0]["status"] == "optimal"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--gpus", "256,abc"), "--gpus"),
        (("--gpus", "8", "--seq-len", "4096,"), "--seq-len"),
        (("--gpus", "8", "--train-tokens", "lots"), "--train-tokens"),
        (("--gpus", "8", "--format", "megatron"), "--format"),
    ],
)
def test_cli_bad_values_exit_2(args, flag):
    result = run(*args)
    assert result.exit_code == 2
    assert flag in result.stderr
