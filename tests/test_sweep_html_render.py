"""The HTML capacity report rendered in headless Chromium, offline: plotly drew every chart and
every point it was given, the page's scripts raised nothing, and a reader can tell what was
planned and which line is which (issue 24): what the browser shows is read back by a script
injected into a copy of the page (``tests/report_measure.js``).

Parsing the page (tests/test_sweep_scale.py) shows what it asks plotly to draw; only a browser
shows that it is drawn, with plotly.js read from the page itself: every host name is unresolvable
here, so a page that fetched plotly.js from a CDN would draw nothing. The browser is a test
prerequisite, installed by ``scripts/test`` (the README's "Run the tests"; ``.ci/run`` runs it).
"""

from __future__ import annotations

import html as htmllib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from tests import html_report

# one worker renders each report once for the module's tests (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("html")
BROWSERS = ("chromium-headless-shell", "chromium", "google-chrome", "google-chrome-stable")
INSTALL = (
    "scripts/test installs it (sudo apt-get update && sudo apt-get install -y "
    "chromium-headless-shell)"
)

# The flags that start Chromium on a machine with no network and no display: no sandbox (CI runs
# as root), no first-run or background services, a fresh profile, every host unresolvable.
_OFFLINE = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",
)

SWEEP = [
    "sweep",
    "--model", "llama-8b",
    "--global-batch", "256",
    "--format", "html",
]  # fmt: skip
FULL = [
    *SWEEP,
    "--gpus", "8,16,32",
    "--gpu", "h100,h200",
    "--train-tokens", "1e12",
    "--gpu-hour-cost", "2.5",
    "--currency", "EUR",
    "--memory-reserve-gib", "4",
]  # fmt: skip
BARE = [*SWEEP, "--gpus", "8,16", "--seq-len", "2048,4096"]  # no --train-tokens / --gpu-hour-cost
MEASURE = (Path(__file__).resolve().parent / "report_measure.js").read_text(encoding="utf-8")


def headless_chromium() -> str:
    """The first Chromium on PATH; a missing browser fails the test (it is a prerequisite)."""
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    pytest.fail(
        f"no headless Chromium on PATH (looked for {', '.join(BROWSERS)}); install it: {INSTALL}",
        pytrace=False,
    )


def render(page: Path, profile: Path, *, width_px: int = 1400) -> tuple[str, list[str]]:
    """The page's DOM once its scripts ran in a ``width_px`` wide window, and the lines its
    console printed."""
    command = [
        headless_chromium(),
        *_OFFLINE,
        f"--user-data-dir={profile}",
        f"--window-size={width_px},1000",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=10000",  # run the page's timers to completion, then dump
        "--dump-dom",
        page.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


def _drawn(values: list) -> int:
    return sum(v is not None for v in values)


def _write_report(args: list[str], target: Path) -> Path:
    result = CliRunner().invoke(app, [*args, "--output", str(target)])
    assert result.exit_code == 0, result.output
    return target


def _measured(report: Path, profile: Path, width_px: int) -> tuple[dict, html_report.Page, list]:
    """Render a copy of ``report`` with the measuring script; what it read back, the DOM and
    the console lines."""
    copy = report.with_name(f"measured-{width_px}-{report.name}")
    text = report.read_text(encoding="utf-8")
    copy.write_text(text.replace("</body>", f"<script>{MEASURE}</script></body>"), "utf-8")
    dom, console = render(copy, profile, width_px=width_px)
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, flags=re.S)
    assert found, f"the measuring script wrote nothing: {console}"
    return json.loads(htmllib.unescape(found.group(1))), html_report.read_page(dom), console


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The report with every flag (two GPU types, price in EUR, a memory reserve) at 1,400 px."""
    folder = tmp_path_factory.mktemp("full")
    report = _write_report(FULL, folder / "plan.html")
    return (report, *_measured(report, folder / "profile", 1400))


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """Two sequence lengths, no --train-tokens or --gpu-hour-cost, in a 700 px window."""
    folder = tmp_path_factory.mktemp("bare")
    report = _write_report(BARE, folder / "plan.html")
    return (report, *_measured(report, folder / "profile", 700))


def test_report_renders_every_chart_offline(full):
    report, measured, page, console = full
    asked = html_report.figure(html_report.read_page(report.read_text(encoding="utf-8")))
    assert console == []  # no script error, no failed fetch, nothing logged
    assert page.with_class("div", "plot-container"), "plotly drew nothing"
    # one subplot per chart: throughput, MFU, days, cost, goodput, memory
    assert set(measured["subplots"]) == {"xy", "x2y2", "x3y3", "x4y4", "x5y5", "x6y6"}
    assert measured["annotations"] == [a["text"] for a in asked["layout"]["annotations"]]
    # every trace, and every point of it, drawn
    lines = [
        t
        for t in asked["data"]
        if t["type"] == "scatter" and t.get("mode") != "lines" and t.get("fill") != "toself"
    ]
    bands = [t for t in asked["data"] if t.get("fill") == "toself"]
    assert len(bands) == 2  # the throughput's error band, one per series
    drawn = [t for sp in measured["subplots"].values() for t in sp["traces"] if t["points"]]
    # (throughput, MFU, days and cost with and without failures, goodput) x (h100, h200)
    assert len(lines) == 7 * 2 == len(drawn)
    assert sum(t["points"] for t in drawn) == sum(_drawn(t["y"]) for t in lines) == 7 * 6
    bars = [t for t in asked["data"] if t["type"] == "bar"]
    outlines = [o for t in measured["subplots"]["x6y6"]["traces"] for o in t["outlines"]]
    assert len(outlines) == sum(_drawn(t["y"]) for t in bars) > 0
    assert [row[0] for row in page.rows if row] == ["8", "16", "32"] * 2  # the layout table


def _text(page: html_report.Page) -> str:
    return " ".join(" ".join(row) for row in page.rows)


def test_the_page_names_what_was_planned(full):
    report, _, page, _ = full
    header = {row[0]: row[1] for row in html_report.read_page(report.read_text("utf-8")).pairs}
    assert header["Model"] == "llama-3-8b (8.0B parameters)"
    assert header["GPUs"].startswith("h100 (h100-sxm: 75.6 GiB usable of 79.6 GiB")
    assert "h200 (h200:" in header["GPUs"] and header["GPU counts"] == "8, 16, 32"
    assert header["Sequence and batch"] == ("seq 4,096: 256 sequences (1,048,576 tokens) per step")
    assert header["Precision"] == "bf16, gradients fp32"
    assert header["Stack"] == "megatron-lm (megatron rules)"
    assert header["Price"] == "2.50 EUR per GPU-hour" and header["Training"] == "1T tokens"
    assert header["autopar"] == autopar.__version__
    assert page.title.startswith("llama-3-8b")


def test_one_colour_per_series_in_every_panel_and_one_legend(full, bare):
    for _, measured, _, _ in (full, bare):
        legend = {e["text"]: e["colour"] for e in measured["legends"]["legend"]}
        assert len(legend) == len(measured["legends"]["legend"])  # each series once
        assert len(set(legend.values())) == len(legend)  # and in its own colour
        last = f"x{len(measured['subplots'])}y{len(measured['subplots'])}"
        for name, sp in measured["subplots"].items():
            lines = [t for t in sp["traces"] if t["points"]]
            if name == last:  # memory: each bar outlined in its series' colour
                outlines = {o for t in sp["traces"] for o in t["outlines"]}
                assert outlines == set(legend.values())
                continue
            # a series' traces of one panel (days with and without failures) share its name
            assert sorted({t["name"] for t in lines}) == sorted(legend)
            for trace in lines:
                assert trace["stroke"] == trace["marker"] == legend[trace["name"]]
    assert {e["text"] for e in full[1]["legends"]["legend"]} == {"h100", "h200"}
    assert {e["text"] for e in bare[1]["legends"]["legend"]} == {"seq 2,048", "seq 4,096"}


def test_gpu_count_ticks_mfu_in_percent_cost_in_its_currency(full):
    _, measured, _, _ = full
    subplots = measured["subplots"]
    for name in ("xy", "x2y2", "x3y3", "x4y4", "x5y5"):
        assert subplots[name]["xticks"] == ["8", "16", "32"]
    assert subplots["x6y6"]["xticks"] == ["8", "16", "32"] * 2
    assert all(t.endswith("%") for t in subplots["x2y2"]["yticks"])
    assert measured["axis_titles"][1:4] == ["MFU", "days", "cost (EUR)"]
    assert "Cost to train 1T tokens at 2.50 EUR per GPU-hour" in measured["annotations"]
    mfu = [float(t.rstrip("%")) for t in subplots["x2y2"]["yticks"]]
    assert 20 < min(mfu) <= max(mfu) < 100  # a percentage, not a fraction
    for name, sp in subplots.items():  # goodputs a point apart once all read "99%"
        assert len(set(sp["yticks"])) == len(sp["yticks"]), (name, sp["yticks"])


def test_days_and_cost_are_drawn_only_with_their_flags(full, bare):
    report, measured, _, _ = bare
    # throughput, MFU, goodput, memory
    assert set(measured["subplots"]) == {"xy", "x2y2", "x3y3", "x4y4"}
    assert not any("train" in a for a in measured["annotations"])
    note = html_report.read_page(report.read_text("utf-8")).missing
    assert note == (
        "Not drawn: Time to train (needs --train-tokens); "
        "Cost to train (needs --train-tokens and --gpu-hour-cost)."
    )
    assert html_report.read_page(full[0].read_text("utf-8")).missing is None


def test_memory_chart_draws_the_capacity_and_the_reserve(full, bare):
    parts = {"weights", "gradients", "optimizer", "activations", "other", "runtime reserve"}
    full_legend = {e["text"] for e in full[1]["legends"]["legend2"]}
    assert full_legend == parts | {"usable memory (capacity)", "GPU memory (usable + reserve)"}
    bare_legend = {e["text"] for e in bare[1]["legends"]["legend2"]}
    assert bare_legend == parts | {"usable memory (capacity)"}  # no reserve, no second line
    figure = html_report.figure(html_report.read_page(full[0].read_text("utf-8")))
    usable = next(t for t in figure["data"] if t["name"] == "usable memory (capacity)")
    levels = {round(y, 1) for y in usable["y"] if y is not None}
    assert levels == {75.6, 136.4}  # H100 and H200 less the 4 GiB reserve


def test_the_table_fits_or_scrolls_in_its_box(full, bare):
    for (_, measured, _, _), width in ((full, 1400), (bare, 700)):
        page, table = measured["page"], measured["table"]
        assert page["inner_width"] == width
        assert page["scroll_width"] <= width  # the page never scrolls sideways
        assert table["box_width"] <= width
        fits = table["width"] <= table["box_width"]
        assert fits or (table["overflow_x"] == "auto" and table["box_scroll_width"] > width / 2)
    assert full[1]["table"]["width"] <= full[1]["table"]["box_width"]  # fits at 1,400 px
    assert bare[1]["table"]["width"] > bare[1]["table"]["box_width"]  # scrolls at 700 px


def test_missing_browser_fails_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no browser on it
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium-headless-shell"):
        headless_chromium()
