"""Feedback while a command works (issue 24: a per-stage solve ran 10 s with nothing on
screen): a spinner with the elapsed time on stderr, shown only when stderr is a terminal and only
once the work has run past ``DELAY_S`` (a quick answer prints nothing extra), and erased when the
work ends, so stdout (tables, JSON, launcher files) and piped or logged stderr never see it. The
sweep has its own progress bar (``autopar.cli.sweep_cmd.progress_reporter``)."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

DELAY_S = 1.0
"""Work shorter than this shows no spinner."""


def _console() -> Any:
    """A rich console on stderr when stderr is a terminal, else None (without importing rich:
    a piped solve pays nothing)."""
    if sys.stderr is None or not sys.stderr.isatty():
        return None
    from rich.console import Console

    return Console(stderr=True)


@contextlib.contextmanager
def working(label: str, *, console: Any = None, delay_s: float | None = None) -> Iterator[None]:
    """``with working("solving"): ...``: a transient spinner on a terminal's stderr after
    ``delay_s`` (default ``DELAY_S``), stopped on every way out (an interrupt included)."""
    console = console if console is not None else _console()
    if console is None or not console.is_terminal:
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        SpinnerColumn(),
        TextColumn(f"autopar: {label}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    progress.add_task(label, total=None)
    lock = threading.Lock()
    state = {"shown": False, "over": False}

    def show() -> None:
        with lock:
            if not state["over"]:
                progress.start()
                state["shown"] = True

    timer = threading.Timer(DELAY_S if delay_s is None else delay_s, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["over"] = True
            if state["shown"]:
                progress.stop()
