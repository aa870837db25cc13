"""The fuzzer's CI subset (issue 15): seeded broken files, logs and flags through the CLI
(in-process, typer's CliRunner) and the API, checked against the contract in
``tests/fuzz/contract.py``. ``benchmarks/fuzz.py`` runs thousands of the same generator; a
failure here prints the seed, and ``python benchmarks/fuzz.py --replay SEED`` replays it."""

from __future__ import annotations

import json
import time

import pytest

import autopar
from autopar.cli import app
from tests.fuzz import timing
from tests.fuzz.contract import run_api, run_cli
from tests.fuzz.generators import GENERATORS, make_case

CI_SEEDS = 240
"""Cases per CI run (every kind gets CI_SEEDS / 6); about 20 s on one core."""
CHUNK = 20


@pytest.mark.parametrize("first", range(0, CI_SEEDS, CHUNK))
def test_generated_inputs_keep_the_contract(tmp_path, first: int) -> None:
    failures = []
    for seed in range(first, first + CHUNK):
        case = make_case(seed)
        folder = tmp_path / str(seed)
        folder.mkdir()
        outcome = run_cli(case, folder, app)
        violations = outcome.violations + run_api(case, folder)
        if violations:
            failures.append(f"{case.describe()}\n    " + "\n    ".join(violations))
    assert not failures, "\n".join(failures)


def test_every_kind_is_generated_and_cases_replay() -> None:
    kinds = {make_case(seed).kind for seed in range(len(GENERATORS))}
    assert kinds == set(GENERATORS)
    assert make_case(1234) == make_case(1234)


@pytest.mark.parametrize(
    "options",
    [
        # 240 divisors per axis: the product tables used to be built from 240**4 rows (20 GB)
        {"model": "qwen3-235b-a22b", "gpus": 831600, "global_batch": 831600},
        {
            "model": "mixtral-8x22b",
            "gpus": 997920,
            "global_batch": 16216200,
            "limits": {"mbs": 4096},
        },
        {"model": "llama-3.1-405b", "gpus": 2**20, "global_batch": 2**24, "seq_len": 2**24},
    ],
    ids=["831600-gpus", "997920-gpus", "maxima"],
)
def test_search_at_the_documented_maxima_keeps_its_time_limit(options) -> None:
    slack = timing.slack_s()
    start = time.perf_counter()
    result = autopar.solve(time_limit=1.0, top=5, **options)
    timing.assert_within_limit(time.perf_counter() - start, 1.0, slack)
    json.dumps(result.to_dict(), allow_nan=False)
