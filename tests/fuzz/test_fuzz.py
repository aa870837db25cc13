"""The fuzzer's CI subset (issue 15): seeded broken files, logs and flags through the CLI
(in-process, typer's CliRunner) and the API, checked against the contract in
``tests/fuzz/contract.py``. ``benchmarks/fuzz.py`` runs thousands of the same generator; a
failure here prints the seed, and ``python benchmarks/fuzz.py --replay SEED`` replays it."""

from __future__ import annotations

import pytest

from autopar.cli import app
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
