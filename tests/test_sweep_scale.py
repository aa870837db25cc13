"""Sweeps that scale out: ``--jobs`` processes, the Dask executor, the progress bar and the
HTML capacity report."""

from __future__ import annotations

import dataclasses
import io
import math
import sys

import pytest
from typer.testing import CliRunner

import autopar
from autopar.base.errors import InputError
from autopar.cli import app
from autopar.sweeps.html import sweep_html
from autopar.sweeps.report import PANELS
from tests import html_report

GRID = dict(
    model="llama-8b",
    gpus=[8, 16, 32, 64],
    global_batch=256,
    pp=1,
    train_tokens=1e12,
    gpu_hour_cost=2.5,
)


def _same(a, b) -> bool:
    """Rows equal field by field (NaN equal to NaN)."""

    def norm(row):
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in dataclasses.asdict(row).items()
        }

    return [norm(r) for r in a.rows] == [norm(r) for r in b.rows]


@pytest.fixture(scope="module")
def serial():
    return autopar.sweep(**GRID, num_workers=1)


def test_jobs_keep_grid_order_and_values(serial):
    done = []
    parallel = autopar.sweep(**GRID, jobs=2, progress=lambda d, t, row: done.append((d, t)))
    assert _same(parallel, serial)
    assert [r.gpus for r in parallel.rows] == [8, 16, 32, 64]
    assert sorted(done) == [(i, 4) for i in range(1, 5)]
    assert parallel.memory_gib == serial.memory_gib


@pytest.mark.xdist_group("dask")  # one worker imports Dask (tests/conftest.py)
def test_dask_executor_on_a_local_cluster(serial):
    from dask.distributed import LocalCluster

    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        result = autopar.sweep(**GRID, executor="dask", scheduler=cluster.scheduler_address)
    assert _same(result, serial)


def test_missing_dask_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # import fails
    with pytest.raises(InputError, match=r"pip install 'autopar\[dask\]'"):
        autopar.sweep(**GRID, executor="dask")


@pytest.mark.parametrize("jobs", [0, -1, True, 1.5])
def test_bad_jobs_is_bad_input(jobs):
    with pytest.raises(InputError, match="--jobs"):
        autopar.sweep(**GRID, jobs=jobs)


@pytest.mark.parametrize("extra", [["--jobs", "0"], ["--jobs", "-3"], ["--executor", "ray"]])
def test_cli_bad_jobs_or_executor_exits_2(extra):
    result = CliRunner().invoke(app, ["sweep", "--model", "llama-8b", "--gpus", "8", *extra])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_progress_bar_on_a_terminal():
    from rich.console import Console

    from autopar.cli.sweep_cmd import progress_reporter

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80)
    with progress_reporter(console) as progress:
        autopar.sweep(**GRID, progress=progress)
    assert "4/4" in out.getvalue()


def test_html_report_is_self_contained_and_complete(serial):
    page = html_report.read_page(sweep_html(serial))
    assert page.external == []  # plotly.js inlined: opens offline, can be mailed
    assert any("plotly" in s.lower() and len(s) > 1_000_000 for s in page.scripts)
    figure = html_report.figure(page)
    titles = [a["text"] for a in figure["layout"]["annotations"]]
    assert titles[:6] == [
        "Throughput per GPU",
        "Model FLOPs utilisation",
        "Time to train 1T tokens",
        "Cost to train 1T tokens at 2.50 USD per GPU-hour",
        "Goodput under failures",
        "Memory per GPU (best layout)",
    ]
    lines = [t for t in figure["data"] if t["type"] == "scatter" and t["mode"] != "lines"]
    traces = sum(len(panel.traces) for panel in PANELS)  # days and cost: with, without failures
    assert len(lines) == traces and all(t["x"] == [8, 16, 32, 64] for t in lines)
    throughput = next(t for t in lines if t["yaxis"] == "y")
    assert throughput["y"] == pytest.approx([r.tokens_per_s_per_gpu for r in serial.rows])
    bars = {t["name"] for t in figure["data"] if t["type"] == "bar"}
    assert bars == {"weights", "gradients", "optimizer", "activations", "other", "runtime reserve"}
    capacity = next(t for t in figure["data"] if t["name"] == "usable memory (capacity)")
    assert max(y for y in capacity["y"] if y) == pytest.approx(serial.inputs.gpus[0].usable_gib)
    table = [row for row in page.rows if row]
    assert [row[0] for row in table] == ["8", "16", "32", "64"]


def test_html_through_the_cli(tmp_path):
    target = tmp_path / "plan.html"
    result = CliRunner().invoke(
        app,
        [
            "sweep",
            "--model",
            "llama-8b",
            "--gpus",
            "8,16",
            "--format",
            "html",
            "--output",
            str(target),
        ],
    )
    assert result.exit_code == 0, result.output
    assert target.read_text().startswith("<!DOCTYPE html>")


def test_html_without_plotly_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    result = CliRunner().invoke(
        app, ["sweep", "--model", "llama-8b", "--gpus", "8", "--format", "html"]
    )
    assert result.exit_code == 2
    assert "pip install 'autopar[html]'" in result.stderr
