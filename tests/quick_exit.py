"""Ending a test process without the interpreter's teardown, for the processes that import the
consumers (torch, megatron-core, transformers, Megatron-Bridge) and need nothing freed at the
end: the ``torch`` xdist group's worker (``tests/conftest.py``) and ``tests/bridge_probe.py``.
Freeing those modules one by one costs seconds; the parent waits for them (xdist's controller
waits for each worker's process to exit, execnet ``Group.terminate``; ``tests/test_bridge.py``
waits for the probe). What the process wrote to files is already closed; only stdio is
flushed."""

from __future__ import annotations

import os
import sys


def exit_now(code: int = 0) -> None:
    """Flush stdout and stderr, then end the process with ``code`` (``os._exit``: no atexit
    handler, finaliser or module teardown runs after this)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
