"""A pytest plugin for ``benchmarks/suite_time.py``: each test's CPU and wall seconds.

Loaded with ``-p benchmarks.suite_cpu`` in the controller and (xdist passes ``-p`` on) in each
worker. Per test it records the process's own CPU (``RUSAGE_SELF``, user + system), the CPU of
the children it reaped meanwhile (``RUSAGE_CHILDREN``: subprocesses, kernels, browsers) and
the wall time of the whole protocol (setup, call, teardown). At the end each process writes
one JSON file into ``$SUITE_CPU_DIR``: its name, its whole-process CPU and the rows.
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from pathlib import Path

import pytest

_ROWS = pytest.StashKey[list]()
"""This process's rows: one dict per test."""


def _cpu_s() -> tuple[float, float]:
    """(own, reaped children's) user + system CPU seconds so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_ROWS] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    own_0, children_0 = _cpu_s()
    wall_0 = time.perf_counter()
    yield
    own_1, children_1 = _cpu_s()
    item.config.stash[_ROWS].append(
        {
            "test": item.nodeid,
            "own_cpu_s": own_1 - own_0,
            "children_cpu_s": children_1 - children_0,
            "wall_s": time.perf_counter() - wall_0,
        }
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = os.environ.get("SUITE_CPU_DIR")
    if not folder:
        return
    own, children = _cpu_s()
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    record = {"process": name, "own_cpu_s": own, "children_cpu_s": children}
    record["tests"] = config.stash[_ROWS]
    # written whole, then renamed: a reader never sees half a file
    fd, temporary = tempfile.mkstemp(dir=folder, suffix=".part")
    with os.fdopen(fd, "w") as handle:
        json.dump(record, handle)
    os.replace(temporary, Path(folder) / f"{name}.json")
