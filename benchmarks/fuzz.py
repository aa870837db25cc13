"""Fuzz autopar with generated broken inputs (issue 15) and count contract violations.

    python benchmarks/fuzz.py --count 10000 [--start 100000] [--subprocess-every 50]
    python benchmarks/fuzz.py --replay SEED      # one case, with its command line and output

Cases come from ``tests/fuzz/generators.py`` (model, GPU, cluster and profile files, nccl-tests
logs, command lines; seeded, so a seed replays a case). Each goes through the CLI in-process
(typer's CliRunner) and through the Python API; every ``--subprocess-every``-th case also runs
as a real ``python -m autopar`` process under a wall-clock timeout (hangs, start-up included).
The contract (``tests/fuzz/contract.py``): exit 0/1/2, one stderr line, no traceback, no
undocumented exception, no hang, ``--time-limit`` held within 1 s, outputs intact, nothing
executed. The CI subset (``tests/fuzz/test_fuzz.py``) runs seeds 0-239; the default start here
is past them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autopar.cli import app  # noqa: E402
from tests.fuzz.contract import (  # noqa: E402
    HANG_S,
    materialise,
    run_api,
    run_cli,
    time_budget_s,
)
from tests.fuzz.generators import make_case  # noqa: E402

CATEGORIES = (
    ("traceback", ("traceback", "exception escaped", "internal error")),
    ("hang", ("hang",)),
    ("undocumented API exception", ("API ",)),
    ("time-limit overrun", ("time:",)),
    ("exit code", ("exit code",)),
    ("stderr lines", ("stderr lines",)),
    ("output file", ("output", "temp file")),
    ("executed", ("executed",)),
)


def _category(violation: str) -> str:
    for name, markers in CATEGORIES:
        if any(marker in violation for marker in markers):
            return name
    return "other"


def run_subprocess(case, folder: Path) -> list[str]:
    """The case as a real process: no hang (wall clock), exit 0/1/2, no traceback."""
    argv, _ = materialise(case, folder)
    if any("\x00" in arg for arg in argv):
        return []  # the OS cannot pass a NUL in an argument; the in-process run covers it
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    budget = time_budget_s(case) + 2.0  # interpreter start-up and imports
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "autopar", *argv],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=HANG_S,
        )
    except subprocess.TimeoutExpired:
        return [f"subprocess hang: no answer after {HANG_S:.0f} s"]
    out = []
    if done.returncode not in (0, 1, 2):
        out.append(f"subprocess exit code {done.returncode}: {done.stderr[-300:]}")
    if "Traceback" in done.stderr:
        out.append("subprocess traceback")
    elapsed = time.perf_counter() - start
    if elapsed > budget:
        out.append(f"subprocess time: {elapsed:.1f} s for --time-limit {case.time_limit_s}")
    return out


def run(count: int, start: int, subprocess_every: int) -> dict:
    counts: collections.Counter = collections.Counter()
    exits: collections.Counter = collections.Counter()
    failures: list[str] = []
    worst_overrun = 0.0
    began = time.perf_counter()
    for seed in range(start, start + count):
        case = make_case(seed)
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            outcome = run_cli(case, folder, app)
            violations = outcome.violations + run_api(case, folder)
            if subprocess_every and seed % subprocess_every == 0:
                with tempfile.TemporaryDirectory() as other:
                    violations += run_subprocess(case, Path(other))
        exits[outcome.exit_code] += 1
        limit = case.time_limit_s
        if limit is not None and 0 <= limit <= HANG_S and case.argv[0] == "solve":
            worst_overrun = max(worst_overrun, outcome.elapsed_s - limit)
        for violation in violations:
            counts[_category(violation)] += 1
        if violations:
            failures.append(f"{case.describe()[:300]}\n    " + "\n    ".join(violations))
    return {
        "cases": count,
        "seeds": [start, start + count - 1],
        "subprocess_cases": count // subprocess_every if subprocess_every else 0,
        "seconds": round(time.perf_counter() - began, 1),
        "exit_codes": {str(k): v for k, v in sorted(exits.items(), key=str)},
        "violations": dict(counts),
        "worst_solve_overrun_s": round(worst_overrun, 2),
        "failures": failures,
    }


def replay(seed: int) -> None:
    case = make_case(seed)
    print(case.describe())
    with tempfile.TemporaryDirectory() as name:
        outcome = run_cli(case, Path(name), app)
        violations = outcome.violations + run_api(case, Path(name))
    print(f"exit {outcome.exit_code} in {outcome.elapsed_s:.2f} s\nstderr: {outcome.stderr}")
    print("violations:", violations or "none")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--start", type=int, default=100_000)
    parser.add_argument("--subprocess-every", type=int, default=50)
    parser.add_argument("--replay", type=int)
    parser.add_argument("--json", help="Also write the summary here.")
    args = parser.parse_args()
    if args.replay is not None:
        replay(args.replay)
        return
    summary = run(args.count, args.start, args.subprocess_every)
    for failure in summary["failures"][:50]:
        print(failure)
    shown = {k: v for k, v in summary.items() if k != "failures"}
    print(json.dumps(shown, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    sys.exit(1 if summary["failures"] else 0)


if __name__ == "__main__":
    main()
