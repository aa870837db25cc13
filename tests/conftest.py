"""Shared fixtures: the repo's paths and a CLI runner."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import sys
from pathlib import Path

# One OpenMP / MKL thread per process, set before anything imports torch or numpy's BLAS. The
# suite runs two xdist workers on two cores, and beside them the processes they start (the
# Megatron-Bridge probe, torch.distributed's gloo ranks, the notebook's kernel, Chromium):
# each OpenMP runtime would start a thread per core and spin-wait between parallel regions
# (libgomp's GOMP_SPINCOUNT), so the processes starved each other. Measured on 2 cores, whole
# suite: 224 s wall without it (one run), 111 and 118 s with it, for the same 190-196 CPU-s
# of user time.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest
import typer.testing
from typer.testing import CliRunner

from tests import lazy_compile, quick_exit

# torch.compile compiles a function when it first runs, not when megatron-core decorates it at
# import (tests/lazy_compile.py): about 2.4 CPU-s less for the worker that imports the consumers
lazy_compile.install()

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"

# typer's CliRunner.invoke builds the click command from the Typer app on every call: 30-100 ms
# of CPU for autopar's whole app (about 300 options, each type hint evaluated), a fifth of the
# suite's CPU over its ~700 invocations. No test changes an app once it runs it, so each app is
# built once (the running command line builds it once per process too).
typer.testing._get_command = functools.cache(typer.testing._get_command)

# The tests that build the consumers' own config classes (megatron-core, torchtitan, DeepSpeed)
# or run torch.distributed are marked ``xdist_group("torch")``: with ``--dist loadgroup``
# (pyproject.toml) they run in one worker, so one process pays torch's import (2-6 s of CPU
# each: torch, megatron-core, DeepSpeed), not both. The tests that read the validation of the
# published runs (``tests/validation.validated``, cached per process) share
# ``xdist_group("validation")``: it is computed once (about 2 s), not in each worker. The
# Megatron-Bridge probe, the notebook and the HTML reports (one run each per session, shared by
# their module's tests) are groups "bridge", "notebook" and "html": one worker runs each once.
# The tests that run a Dask cluster or client are group "dask": one worker imports Dask's
# ``distributed`` (about 0.4 CPU-s) and starts the threads cluster a module shares.


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``xdist_group`` marks as ``--dist loadgroup`` reads them: the group name after an
    ``@`` at the end of each node id, the one channel from a worker's collection to the
    controller's scheduler. pytest-xdist 3.8 writes it to ``item._nodeid``, which pytest 9.2 no
    longer reads (node ids are ``item._id``): every group was silently ignored and its tests
    spread over both workers (pytest-xdist issue #1386). Written here where xdist's did not take;
    left alone where it did (older pytest) or when not run under ``--dist loadgroup``."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        marks = item.iter_markers("xdist_group")  # as xdist reads them (remote.py)
        names = sorted(
            {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks}
        )
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = type(item._id).parse(item.nodeid + suffix)


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker ends without the interpreter's teardown. The controller waits for each
    worker's process to exit (execnet ``Group.terminate``: ``gw._io.wait()``), and a worker that
    imported torch, megatron-core and the other consumers spent 3-4 s of that wall freeing them.
    The handler is registered first, so it runs last: after pytest has sent its results and
    every later-registered atexit handler ran. Measured (suite_time-style runs, this machine):
    last test -> controller finished 4.1-5.1 s before, 1.0-1.2 s after."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        atexit.register(quick_exit.exit_now)


_FROZEN_AT = pytest.StashKey[int]()
"""How many modules were loaded when this process last froze the collector's objects."""


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze(session.config)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test that imported a library (100 modules or more: torch, megatron-core, Bridge,
    pandas' plotting), what it loaded goes to the collector's permanent generation
    (``gc.freeze``, the CPython docs' advice after start-up), so later full collections do not
    walk millions of long-lived objects again. Measured, whole suite, two instrumented runs
    each: GC pauses 8-11 s -> 5-7 s, CPU 99-103 -> 89-93 s (all processes)."""
    if len(sys.modules) > item.config.stash.get(_FROZEN_AT, 0) + 100:
        _freeze(item.config)


def _freeze(config: pytest.Config) -> None:
    gc.freeze()
    config.stash[_FROZEN_AT] = len(sys.modules)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
