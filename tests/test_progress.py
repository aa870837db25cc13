"""Feedback while a solve works (issue 24: a per-stage solve ran 10 s with nothing on screen): a
spinner on a terminal's stderr past one second, nothing for quick work, in pipes or on stdout."""

from __future__ import annotations

import io
import json
import time

from rich.console import Console

from autopar.cli import app, progress
from autopar.cli.progress import working


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=80), out


def _wait_for(text: str, out: io.StringIO, *, timeout_s: float = 10.0) -> None:
    """Work that lasts until ``text`` is on the terminal (or ``timeout_s`` is over), in place of
    a fixed sleep long enough for the spinner to show."""
    deadline = time.monotonic() + timeout_s
    while text not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_work_past_the_delay_shows_a_spinner_that_is_erased() -> None:
    console, out = _terminal()
    with working("solving", console=console, delay_s=0.05):
        _wait_for("autopar: solving", out)
    text = out.getvalue()
    assert "autopar: solving" in text
    assert text.endswith("\x1b[?25h") or "\x1b[2K" in text  # the line is cleared (transient)


def test_quick_work_and_a_pipe_show_nothing() -> None:
    console, out = _terminal()
    with working("solving", console=console, delay_s=5.0):
        time.sleep(0.05)
    assert out.getvalue() == ""
    piped = io.StringIO()
    with working("solving", console=Console(file=piped), delay_s=0.0):  # not a terminal
        time.sleep(0.2)
    assert piped.getvalue() == ""


def test_an_interrupt_stops_the_spinner() -> None:
    console, out = _terminal()
    try:
        with working("solving", console=console, delay_s=0.0):
            _wait_for("autopar: solving", out)  # the spinner runs
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    time.sleep(0.2)
    after = out.getvalue()
    time.sleep(0.3)
    assert out.getvalue() == after  # nothing refreshes once the work has ended


def test_solve_shows_it_on_stderr_only(runner, monkeypatch) -> None:
    """A real solve with a terminal on stderr: the spinner goes there, stdout stays JSON."""
    console, out = _terminal()
    monkeypatch.setattr(progress, "_console", lambda: console)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    result = runner.invoke(app, ["solve", "--model", "llama-8b", "--gpus", "8", "-f", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "optimal"
    assert "autopar: solving" in out.getvalue()
    assert "solving" not in result.stdout
