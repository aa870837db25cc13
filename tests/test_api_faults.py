"""The Python API's faults (issue 24, findings 16 and 18): ``.best`` when nothing fits, counts
as ints (numpy integers included, floats refused with one rule), ordered collections for sweep
lists, and a library that cannot load under a memory limit."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import autopar
from autopar.base.errors import InfeasibleError, InputError
from tests.conftest import REPO

SMALL = dict(model="llama-8b", num_workers=1, global_batch=256, pp=1)


def test_best_of_an_infeasible_result_is_the_documented_error() -> None:
    """Finding 16: ``autopar.solve(model="llama-70b", gpus=384).best`` was a bare IndexError
    (here one GPU, which holds no layout of it: the same answer, faster; 7 GPUs of Llama-3 8B,
    once infeasible, now split its 32 layers unevenly over 7 stages)."""
    result = autopar.solve(model="llama-70b", gpus=1, num_workers=1)
    assert result.status == "infeasible" and result.layouts == ()
    with pytest.raises(InfeasibleError) as error:
        _ = result.best
    assert error.value.explanation["summary"] == result.explanation.summary
    assert "no layout (infeasible)" in str(error.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"gpus": np.int64(8)},
        {"gpus": 8, "seq_len": np.int32(4096)},
        {"gpus": 8, "global_batch": np.int64(512)},
        {"gpus": 8, "top": np.int64(2)},
        {"gpus": 8, "tp": np.int64(8)},
        {"gpus": 8, "limits": {"pp": np.int64(1)}},
        {"gpus": 8, "num_workers": np.int64(1)},
        {"gpus": 8, "time_limit": np.float32(5.0)},
    ],
)
def test_numpy_numbers_are_taken_as_numbers(kwargs) -> None:
    """Finding 18: each was "must be an integer, got a value of type int64"."""
    options = {"num_workers": 1, "model": "llama-8b", "global_batch": 256, **kwargs}
    result = autopar.solve(**options)
    assert result.status == "optimal"
    assert type(result.best.layout.tp) is int


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"gpus": 1024.0}, "--gpus: must be an integer, got the float 1024.0 (pass 1024)"),
        ({"gpus": 64, "global_batch": 512.0}, "--global-batch: must be an integer, got the float"),
        ({"gpus": 64, "num_workers": 2.0}, "--num-workers: must be an integer, got the float"),
        ({"gpus": None}, "--gpus: is required"),
        ({"gpus": 64, "tp": np.bool_(True)}, "--tp: must be an integer"),
    ],
)
def test_floats_and_missing_counts_are_refused_with_one_rule(kwargs, fragment) -> None:
    """Finding 18: ``gpus=1024.0`` was "must be a positive integer, got 1024.0" while
    ``jobs=2.0`` passed and ``num_workers=2.0`` reached OR-Tools as a TypeError."""
    with pytest.raises(InputError) as error:
        autopar.solve(**{"model": "llama-8b", **kwargs})
    assert fragment in str(error.value)


def test_sweep_counts_follow_the_same_rule() -> None:
    with pytest.raises(InputError, match="--jobs: must be an integer, got the float 2.0"):
        autopar.sweep(**SMALL, gpus=[8], jobs=2.0)
    rows = autopar.sweep(**SMALL, gpus=[np.int64(8)], jobs=np.int64(1)).rows
    assert [type(row.gpus) for row in rows] == [int]


@pytest.mark.parametrize(
    "gpus", [range(8, 17, 8), np.array([8, 16]), (8, 16)], ids=["range", "array", "tuple"]
)
def test_sweep_lists_take_any_ordered_collection(gpus) -> None:
    """Finding 18: a range or an array was "must be an integer, got a value of type range"."""
    assert [row.gpus for row in autopar.sweep(**SMALL, gpus=gpus).rows] == [8, 16]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"gpus": {8, 16}}, "--gpus: must be a positive integer or a list of them, got a set"),
        ({"gpus": {"a": 1}}, "--gpus: must be a positive integer or a list of them, got a mapping"),
        ({"gpus": None}, "--gpus: is required"),
        ({"gpus": 8, "gpu": {"h100"}}, "--gpu: must be a GPU name or a list of them, got a set"),
    ],
)
def test_sweep_lists_say_what_they_take(kwargs, fragment) -> None:
    """Finding 18: a set of GPU names was "a list of 1 item(s)", a mapping "must be an
    integer"."""
    with pytest.raises(InputError) as error:
        autopar.sweep(**SMALL, **kwargs)
    assert fragment in str(error.value)


@pytest.mark.parametrize(
    ("module", "raises", "extra"),
    [
        (
            "ortools",
            'ImportError("libscip.so: failed to map segment from shared object")',
            ["--pipeline-plan", "per-stage"],  # a solve that scoring answers loads no OR-Tools
        ),
        ("typer", "MemoryError()", []),
    ],
)
def test_a_library_that_cannot_load_is_exit_4_not_1(tmp_path, module, raises, extra) -> None:
    """Finding 18: under ``ulimit -v`` the import failed with a traceback and exit 1, the code
    of "infeasible". A stand-in package that fails as a library does under a memory limit
    (``typer`` before the command line runs, OR-Tools inside the command)."""
    fake = tmp_path / module
    fake.mkdir()
    (fake / "__init__.py").write_text(f"raise {raises}\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    done = subprocess.run(
        [sys.executable, "-m", "autopar", "solve", "--model", "llama-8b", "--gpus", "8", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("autopar: cannot start: ")
