"""The HTML capacity report rendered in headless Chromium, offline: plotly drew every chart and
every point it was given, and the page's scripts raised nothing.

Parsing the page (tests/test_sweep_scale.py) shows what it asks plotly to draw; only a browser
shows that it is drawn, with plotly.js read from the page itself: every host name is unresolvable
here, so a page that fetched plotly.js from a CDN would draw nothing. The browser is a test
prerequisite, installed by ``scripts/test`` (the README's "Run the tests"; ``.ci/run`` runs it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from tests import html_report

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
    "--gpus", "8,16,32",
    "--gpu", "h100,h200",
    "--global-batch", "256",
    "--train-tokens", "1e12",
    "--gpu-hour-cost", "2.5",
    "--format", "html",
]  # fmt: skip


def headless_chromium() -> str:
    """The first Chromium on PATH; a missing browser fails the test (it is a prerequisite)."""
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    pytest.fail(
        f"no headless Chromium on PATH (looked for {', '.join(BROWSERS)}); install it: {INSTALL}",
        pytrace=False,
    )


def render(page: Path, profile: Path) -> tuple[str, list[str]]:
    """The page's DOM once its scripts ran, and the lines its console printed."""
    command = [
        headless_chromium(),
        *_OFFLINE,
        f"--user-data-dir={profile}",
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


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("report") / "plan.html"
    result = CliRunner().invoke(app, [*SWEEP, "--output", str(target)])
    assert result.exit_code == 0, result.output
    return target


def test_report_renders_every_chart_offline(report, tmp_path):
    asked = html_report.figure(html_report.read_page(report.read_text(encoding="utf-8")))
    dom, console = render(report, tmp_path / "profile")
    page = html_report.read_page(dom)
    assert console == []  # no script error, no failed fetch, nothing logged
    assert page.with_class("div", "plot-container"), "plotly drew nothing"
    # one subplot per chart: throughput, MFU, days, cost, memory
    subplots = {a["class"].split()[1] for a in page.with_class("g", "subplot")}
    assert subplots == {"xy", "x2y2", "x3y3", "x4y4", "x5y5"}
    titles = [a["data-unformatted"] for a in page.with_class("text", "annotation-text")]
    assert titles == [a["text"] for a in asked["layout"]["annotations"]]
    # every trace, and every point of it, drawn
    lines = [t for t in asked["data"] if t["type"] == "scatter"]
    bars = [t for t in asked["data"] if t["type"] == "bar"]
    assert len(lines) == 4 * 2  # four charts x (h100, h200)
    assert len(page.with_class("g", "trace scatter")) == len(lines)
    assert len(page.with_class("g", "trace bars")) == len(bars) > 0
    assert len(page.with_class("path", "point")) == sum(_drawn(t["y"]) for t in lines)
    assert len(page.with_class("g", "point")) == sum(_drawn(t["y"]) for t in bars)
    curves = [a["d"] for a in page.with_class("path", "js-line") if "L" in a["d"]]
    assert sorted(d.count("L") + 1 for d in curves) == [3] * len(lines)  # 8, 16, 32 GPUs
    assert [row[0] for row in page.rows if row] == ["8", "16", "32"] * 2  # the layout table


def test_missing_browser_fails_with_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no browser on it
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium-headless-shell"):
        headless_chromium()
