"""Ctrl-C and SIGTERM while the command line starts (issue 15).

The command line loads typer, then OR-Tools, numpy and pandas: up to a second in which Python's
default Ctrl-C handler would print a ``KeyboardInterrupt`` traceback. When the process is the
``autopar`` command (the console script or ``python -m autopar``), this module, imported first
by ``autopar.cli``, makes both signals end the start-up quietly: one line and exit 130 / 143. The
CLI (``autopar.cli.errors.run_guarded``) takes the signals over once it runs.

A library that cannot load (an ``ImportError`` or ``MemoryError`` under a memory limit:
"failed to map segment from shared object") ends the start-up the same way: one line and exit
``EXIT_ENVIRONMENT`` (4), not a traceback and exit 1, which is the code of "infeasible". (A C
library that exits the process itself, as OpenBLAS does when its buffers cannot be allocated,
is out of Python's reach.) Imported as a library, this module changes nothing.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
EXIT_ENVIRONMENT = 4
"""The machine failed the run: a library could not load (out of memory?), or sweep points were
lost with their worker process (``autopar.cli.errors``)."""


def is_command_line() -> bool:
    """Whether this process is the ``autopar`` command (not a program importing autopar)."""
    argv = getattr(sys, "orig_argv", [])
    as_module = any(argv[i : i + 2] == ["-m", "autopar"] for i in range(len(argv)))
    return as_module or os.path.basename(sys.argv[0] if sys.argv else "") == "autopar"


def _exit_quietly(signum: int, frame: Any) -> None:
    """One line, then out at once. Not ``sys.exit``: a ``SystemExit`` raised while a C
    extension initialises (pandas' Cython modules, under OR-Tools' import) is turned into an
    ``ImportError`` with a traceback and exit 1. Nothing is written yet that needs cleaning up."""
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    sys.stderr.write(f"autopar: {word}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODES.get(signum, 1))


def cannot_start_line(error: BaseException) -> str:
    """The one line for a library that failed to load (without the ``autopar:`` prefix)."""
    text = " ".join(str(error).split())[:300] or "no message"
    return (
        f"cannot start: {type(error).__name__}: {text} (a library failed to load: out of "
        "memory under a memory limit, or a broken installation)"
    )


def _cannot_start(kind: type[BaseException], error: BaseException, trace: Any) -> None:
    """``sys.excepthook`` of the command line: an import that failed before the CLI runs is one
    line and exit 4; anything else goes to Python's own hook."""
    if not issubclass(kind, ImportError | MemoryError):
        sys.__excepthook__(kind, error, trace)
        return
    sys.stderr.write(f"autopar: {cannot_start_line(error)}\n")
    sys.stderr.flush()
    os._exit(EXIT_ENVIRONMENT)


def guard_start_up() -> None:
    """Install the quiet exits, when this process is the command line and the main thread."""
    if not is_command_line():
        return
    sys.excepthook = _cannot_start
    try:
        for signum in EXIT_CODES:
            signal.signal(signum, _exit_quietly)
    except ValueError:  # not the main thread
        pass


guard_start_up()
