"""Ctrl-C and SIGTERM while the command line starts (issue 15).

The command line loads typer, then OR-Tools, numpy and pandas: up to a second in which Python's
default Ctrl-C handler would print a ``KeyboardInterrupt`` traceback. When the process is the
``autopar`` command (the console script or ``python -m autopar``), this module, imported first
by ``autopar.cli``, makes both signals end the start-up quietly: one line and exit 130 / 143. The
CLI (``autopar.cli.errors.run_guarded``) takes the signals over once it runs. Imported as a
library, it changes nothing.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


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


def guard_start_up() -> None:
    """Install the quiet exits, when this process is the command line and the main thread."""
    if not is_command_line():
        return
    try:
        for signum in EXIT_CODES:
            signal.signal(signum, _exit_quietly)
    except ValueError:  # not the main thread
        pass


guard_start_up()
