"""The sweep report's declarations (``autopar.sweeps.report``): a panel, trace, band or column
is one entry, and the text table, the HTML page and JSON read the same tables and inputs."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from autopar.sweeps import charts, report
from autopar.sweeps.html import sweep_html
from tests import html_report


@pytest.fixture(scope="module")
def swept():
    return autopar.sweep(
        model="llama-8b", gpus=[8, 16], gpu=["h100", "h200"], global_batch=256, pp=1,
        train_tokens=2e11, gpu_hour_cost=3.0, currency="EUR", memory_reserve_gib=2,
    )  # fmt: skip


def test_inputs_say_what_every_point_assumed(swept):
    inputs = swept.inputs
    assert inputs.model == "llama-3-8b" and inputs.gpu_counts == (8, 16)
    h100 = inputs.gpu("h100")
    assert h100.name == "h100-sxm" and h100.reserve_gib == pytest.approx(2.0)
    assert h100.usable_gib == pytest.approx(h100.memory_gib - 2.0)
    best = autopar.solve(model="llama-8b", gpus=8, global_batch=256, pp=1, memory_reserve_gib=2)
    assert best.best.capacity_bytes / 2**30 == pytest.approx(h100.usable_gib)
    data = json.loads(json.dumps(swept.to_dict()))
    assert data["inputs"]["currency"] == "EUR" and data["inputs"]["train_tokens"] == 2e11


def test_a_declared_panel_with_a_band_is_drawn_in_the_series_colours(swept, monkeypatch):
    band = report.Trace(
        label="step time", value="step_time_s", band=(lambda r: r.step_time_s * 0.9, "step_time_s")
    )
    extra = report.Panel(key="step", title="Step time", axis="s", traces=(band,))
    monkeypatch.setattr(charts, "PANELS", (*report.PANELS, extra))
    figure = charts.figure(swept).to_plotly_json()
    assert "Step time" in [a["text"] for a in figure["layout"]["annotations"]]
    fills = [t for t in figure["data"] if t.get("fill") == "toself"]
    lines = [t for t in figure["data"] if t.get("mode") == "lines+markers"]
    assert len([f for f in fills if "step time range" in f["name"]]) == 2  # one per series
    assert len([f for f in fills if "tokens/s per GPU range" in f["name"]]) == 2  # error band
    for fill in fills:
        colour = next(t["line"]["color"] for t in lines if t["name"] in fill["name"])
        red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
        assert fill["fillcolor"].startswith(f"rgba({red},{green},{blue},")
    assert sum(t["showlegend"] is not False for t in lines) == 2  # one legend entry per series


def test_a_declared_column_shows_in_the_text_and_html_tables(swept, monkeypatch):
    column = report.Column(key="tokens_per_s", title="tok/s", fmt=",.0f")
    monkeypatch.setattr(report, "COLUMNS", (*report.COLUMNS, column))
    rows = html_report.read_page(sweep_html(swept)).rows
    assert [row[-1] for row in rows if row] == [f"{r.tokens_per_s:,.0f}" for r in swept.rows]
    from autopar.cli.sweep_cmd import sweep_table

    head = sweep_table(swept).splitlines()[0]
    assert head.split()[-3:] == ["cost", "EUR", "tok/s"]


def test_columns_follow_the_axes_and_drop_what_never_varies(swept):
    titles = [c.title for c in report.shown_columns(swept.rows)]
    assert {"TP", "PP", "DP", "CP", "mbs", "GA", "recompute", "ZeRO", "SP"} <= set(titles)
    assert "EP" not in titles and "ETP" not in titles  # dense: EP 1 everywhere
    assert "why no layout" not in titles  # every point has a layout
    bare = [dataclasses.replace(r, days_to_train=float("nan")) for r in swept.rows]
    assert "days" not in [c.title for c in report.shown_columns(bare)]


@pytest.mark.parametrize(
    ("counts", "ticks"),
    [
        ([256, 512, 1024, 2048], ["256", "512", "1,024", "2,048"]),
        (list(range(64, 64 * 40, 64)), ["64", "128", "256", "512", "1,024", "2,048"]),
        ([1000, 3000], ["1,000", "3,000"]),
    ],
)
def test_gpu_ticks_are_gpu_counts(counts, ticks):
    values, texts = charts.gpu_ticks(counts)
    assert texts == ticks and values == [int(t.replace(",", "")) for t in ticks]


def test_cli_currency_and_table_header(tmp_path):
    args = ["sweep", "--model", "llama-8b", "--gpus", "8", "--global-batch", "256"]
    priced = [*args, "--train-tokens", "1e11", "--gpu-hour-cost", "2", "--currency", "GBP"]
    runner = CliRunner()
    table = runner.invoke(app, priced)
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[0].endswith("days cost GBP")
    bad = runner.invoke(app, [*priced[:-1], " "])
    assert bad.exit_code == 2 and "--currency" in bad.stderr


def test_the_readme_shows_its_sweep_report():
    """The README links the screenshot of its own HTML sweep, drawn by docs/sweep_screenshot.py
    from the README's command (which names both flags, so every chart is drawn)."""
    import importlib.util
    import struct
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    assert "](docs/sweep-report.png)" in readme
    png = (repo / "docs" / "sweep-report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">I", png[16:20])[0] == 1400
    spec = importlib.util.spec_from_file_location("shot", repo / "docs" / "sweep_screenshot.py")
    shot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shot)
    command = shot.readme_command()
    assert command[0] == "sweep" and {"--train-tokens", "--gpu-hour-cost"} <= set(command)
    assert "-o" not in command and "--output" not in command
