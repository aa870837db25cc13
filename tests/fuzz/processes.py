"""``python -m autopar`` in a real process, for the signal and fault tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO


def start(args: list[str], cwd: Path, *, own_group: bool = False) -> subprocess.Popen:
    """The command running in ``cwd`` with pipes for stdout and stderr; ``own_group`` puts it
    in a process group of its own, as a shell job, so that a terminal's Ctrl-C can be sent to
    it and its children alike (``os.killpg``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "autopar", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_group,
    )


def wait_for(process: subprocess.Popen, fragment: str, timeout_s: float = 60.0) -> list[str]:
    """Read stderr until a line holds ``fragment`` (a sweep's progress line); the lines read."""
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        lines.append(line)
        if not line or fragment in line:
            break
    return lines
