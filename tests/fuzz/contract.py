"""Run a generated case and check autopar's contract on it (issue 15, DESIGN §7):

- the exit code is 0, 1 (infeasible) or 2 (bad input);
- no traceback, no exception escapes; on failure stderr is one line (option-parser usage
  errors keep click's own format, which starts ``Usage:``), of bounded length;
- no hang: every run ends within ``HANG_S``; a run given ``--time-limit T`` ends within
  ``T + TIME_LIMIT_SLACK_S`` (plus a fixed allowance for loading and start-up; the slack grows
  with the load, ``tests.fuzz.timing``);
- output files intact: a run that fails (exit 2) leaves an existing ``--output`` byte for byte,
  a run that answers (0) writes it whole (1: the explanation, or nothing), and no ``*.tmp``
  is left beside it;
- nothing in an input file is executed (no ``PWNED`` file appears).

The same inputs go through the Python API, where only ``InputError``, ``InfeasibleError`` and
``OutputError`` may be raised, and every result's ``to_dict()`` is strict JSON.
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from typer.testing import CliRunner

from tests.fuzz.generators import LONG_NAME, MARKER, Case

HANG_S = 30.0
"""A run of any command that takes longer than this has hung."""
TIME_LIMIT_SLACK_S = 1.0
"""``--time-limit`` covers the whole command: at most this much over it (issue 15 target)."""
STARTUP_ALLOWANCE_S = 1.5
"""Loading, the CLI and the cost-model tables before the solver's clock starts."""
MAX_OUTPUT_CHARS = 1_000_000
SENTINEL = b"previous output, must survive a failed run\n"


class Hang(BaseException):
    """Raised by the watchdog alarm: a BaseException so no ``except Exception`` swallows it."""


@dataclass
class Outcome:
    case: Case
    exit_code: int | None = None
    elapsed_s: float = 0.0
    violations: list[str] = field(default_factory=list)
    stderr: str = ""

    def ok(self) -> bool:
        return not self.violations


@contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise ``Hang`` in the main thread after ``seconds`` (SIGALRM; Python code only)."""

    def fire(signum, frame):
        raise Hang()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def materialise(case: Case, folder: Path) -> tuple[list[str], Path | None]:
    """Write the case's files into ``folder`` and return its argv and output path."""
    names: dict[str, str] = {}
    for name, content in case.files.items():
        path = folder / name
        path.write_bytes(content)
        names["{" + name + "}"] = str(path)
    names.setdefault("{model}", str(folder / "model.yaml"))
    out: Path | None = None
    if case.output != "none":
        out = {
            "fresh": folder / "out" / "result.txt",
            "existing": folder / "out" / "result.txt",
            "directory": folder / "out",
            "missing-dir": folder / "missing" / "result.txt",
            "long": folder / "out" / LONG_NAME,
        }[case.output]
        (folder / "out").mkdir(exist_ok=True)
        if case.output == "existing":
            out.write_bytes(SENTINEL)
        names["{out}"] = str(out)
    argv = [names.get(arg, arg) for arg in case.argv]
    return argv, out


def _stderr_violations(outcome: Outcome, stdout: str, stderr: str) -> None:
    text = stdout + stderr
    if "Traceback" in text:
        outcome.violations.append("traceback in the output")
    if len(stdout) > MAX_OUTPUT_CHARS or len(stderr) > MAX_OUTPUT_CHARS:
        outcome.violations.append(f"output of {len(stdout) + len(stderr):,} characters")
    if outcome.exit_code not in (0, 1, 2):
        outcome.violations.append(f"exit code {outcome.exit_code}: {stderr.strip()[:300]}")
    if outcome.exit_code in (1, 2) and not stderr.startswith("Usage:"):
        lines = [line for line in stderr.splitlines() if line.strip()]
        if len(lines) != 1 or len(lines[0]) > 1000:
            outcome.violations.append(f"{len(lines)} stderr lines: {stderr[:300]!r}")
    if "internal error" in stderr:
        outcome.violations.append(f"internal error: {stderr.strip()[:300]}")


def _output_violations(outcome: Outcome, case: Case, out: Path | None, stdout: str) -> None:
    if out is None:
        return
    folder = out.parent
    if folder.is_dir() and any(p.name.endswith(".tmp") for p in folder.iterdir()):
        outcome.violations.append("temp file left beside the output")
    changed = case.output == "existing" and out.read_bytes() != SENTINEL
    if changed and outcome.exit_code not in (0, 1):
        outcome.violations.append("a failed run changed the existing output")
    if case.output in ("fresh", "existing") and outcome.exit_code == 0:
        content = out.read_bytes() if out.is_file() else b""
        if not content or content == SENTINEL:
            outcome.violations.append("a successful run did not write its output")
        elif "json" in case.argv and case.argv[0] != "calibrate":
            try:
                json.loads(content)
            except ValueError:
                outcome.violations.append("--output holds invalid JSON")
    if case.output in ("directory", "missing-dir", "long") and outcome.exit_code != 2:
        outcome.violations.append(f"--output {case.output} gave exit {outcome.exit_code}")


def time_budget_s(case: Case) -> float:
    limit = case.time_limit_s
    if limit is None or not math.isfinite(limit) or limit < 0 or limit > HANG_S:
        return HANG_S
    points = 1
    if case.argv and case.argv[0] == "sweep":
        points = 5  # per-point limit; the grids generated here have at most a few points
    return points * limit + TIME_LIMIT_SLACK_S + STARTUP_ALLOWANCE_S


def run_cli(case: Case, folder: Path, app) -> Outcome:
    """Run ``case`` in-process with typer's CliRunner and check the contract."""
    outcome = Outcome(case)
    argv, out = materialise(case, folder)
    runner = CliRunner()
    start = time.perf_counter()
    try:
        with watchdog(HANG_S):
            result = runner.invoke(app, argv, catch_exceptions=True)
    except Hang:
        outcome.elapsed_s = time.perf_counter() - start
        outcome.violations.append(f"hang: no answer after {HANG_S:.0f} s")
        return outcome
    outcome.elapsed_s = time.perf_counter() - start
    outcome.exit_code = result.exit_code
    outcome.stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        name = type(result.exception).__name__
        outcome.violations.append(f"exception escaped: {name}: {str(result.exception)[:200]}")
    _stderr_violations(outcome, result.stdout, result.stderr)
    _output_violations(outcome, case, out, result.stdout)
    budget = time_budget_s(case)
    if outcome.elapsed_s > budget and budget < HANG_S:  # over: does the load explain it?
        from tests.fuzz.timing import slack_s  # measured only then (it solves 6 times)

        budget += slack_s() - TIME_LIMIT_SLACK_S
    if outcome.elapsed_s > budget:
        outcome.violations.append(
            f"time: {outcome.elapsed_s:.1f} s for --time-limit {case.time_limit_s}"
        )
    if (folder / MARKER).exists():
        outcome.violations.append("a YAML tag was executed")
    return outcome


# ---------------------------------------------------------------------------------------------
# the Python API on the same files


def api_calls(case: Case, folder: Path) -> list[tuple[str, object]]:
    """(label, thunk) pairs calling the API on the case's files."""
    import autopar
    from autopar.calibration.nccl import parse_nccl_log
    from autopar.calibration.profile_io import load_profile
    from autopar.inputs.loading import load_cluster, load_gpu, load_model, load_stack

    calls: list[tuple[str, object]] = []
    for name in case.files:
        path = str(folder / name)
        if name.startswith("model"):
            calls.append(("load_model", lambda p=path: load_model(p)))
            calls.append(
                ("solve", lambda p=path: autopar.solve(model=p, gpus=8, time_limit=1.0, top=2))
            )
        elif name.startswith("gpu"):
            calls.append(("load_gpu", lambda p=path: load_gpu(p)))
        elif name.startswith("cluster"):
            calls.append(("load_cluster", lambda p=path: load_cluster(cluster_file=p)))
        elif name.startswith("stack"):
            calls.append(("load_stack", lambda p=path: load_stack(p)))
        elif name.startswith("profile"):
            calls.append(("load_profile", lambda p=path: load_profile(p)))
        elif name.endswith(".log"):
            calls.append(("parse_nccl_log", lambda p=path: parse_nccl_log(p)))
    return calls


def run_api(case: Case, folder: Path) -> list[str]:
    """Violations of the API contract on the case's files (already materialised)."""
    from autopar.base.errors import InfeasibleError, InputError, OutputError

    violations = []
    for label, call in api_calls(case, folder):
        try:
            with watchdog(HANG_S):
                result = call()
            if hasattr(result, "to_dict") and hasattr(result, "status"):  # SolveResult
                json.dumps(result.to_dict(), allow_nan=False)
        except (InputError, InfeasibleError, OutputError):
            pass
        except Hang:
            violations.append(f"API {label}: hang")
        except Exception as err:  # the contract: nothing else escapes
            violations.append(f"API {label}: {type(err).__name__}: {str(err)[:200]}")
    return violations
