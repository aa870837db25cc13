"""The test suite's time on this machine, and where it goes (issue 19: under 60 s on 2 cores).

Runs the README's test command's pytest (``python -m pytest -q``, the project's addopts: two
xdist workers) as CI does (``CI=true``, bytecode written), with ``benchmarks/suite_cpu.py``
loaded in every process, and prints:

- pytest's own figure ("N passed in X s": the target's), the whole run's wall and CPU
  (``os.wait4``: the controller, the workers and everything they started and reaped);
- each process's CPU and its busy wall (the sum of its tests' wall times): how evenly the two
  workers share the tests, and what start-up and collection cost besides;
- the files that cost the most CPU (own + children), and the tests whose wall most exceeds
  their CPU (waiting: sleeps, timeouts, browsers whose processes are not reaped).

    python benchmarks/suite_time.py [--repeat 3] [--top 25] [-- PYTEST ARGS]

On a shared machine one run's figures move by 15-20%: compare runs made in turn, and quote
the median of ``--repeat``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 60.0
PASSED = re.compile(r"in (\d+(?:\.\d+)?)s")


def run_suite(pytest_args: list[str]) -> dict:
    """One run: pytest's reported seconds, wall and CPU, and every process's record."""
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as folder:
        env = {**os.environ, "CI": "true", "SUITE_CPU_DIR": folder}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # CI writes bytecode
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.suite_cpu", *pytest_args]
        start = time.perf_counter()
        process = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        output = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
        wall_s = time.perf_counter() - start
        tail = output.strip().splitlines()[-1] if output.strip() else ""
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"the suite failed: {tail}")
        found = PASSED.search(tail)
        records = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    return {
        "pytest_s": float(found.group(1)) if found else float("nan"),
        "wall_s": wall_s,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "summary": tail,
        "processes": records,
    }


def _tests(run: dict) -> list[dict]:
    return [test for record in run["processes"] for test in record["tests"]]


def by_file(run: dict) -> list[tuple[str, float, float, int]]:
    """(file, CPU s, wall s, tests) per test file, most CPU first."""
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for test in _tests(run):
        entry = files[test["test"].split("::")[0]]
        entry[0] += test["own_cpu_s"] + test["children_cpu_s"]
        entry[1] += test["wall_s"]
        entry[2] += 1
    return sorted(((f, c, w, int(n)) for f, (c, w, n) in files.items()), key=lambda r: -r[1])


def waiting(run: dict) -> list[tuple[str, float]]:
    """(test, wall - CPU s) for the tests that wait, most waiting first."""
    gaps = [(t["test"], t["wall_s"] - t["own_cpu_s"] - t["children_cpu_s"]) for t in _tests(run)]
    return sorted((g for g in gaps if g[1] > 0.05), key=lambda g: -g[1])


def report(run: dict, top: int) -> list[str]:
    lines = [
        f"pytest: {run['summary']}",
        f"wall {run['wall_s']:.1f} s, CPU {run['cpu_s']:.1f} s (all processes)",
        "process      CPU s  tests  busy wall s",
    ]
    for record in run["processes"]:
        cpu = record["own_cpu_s"] + record["children_cpu_s"] * (record["process"] != "controller")
        busy = sum(t["wall_s"] for t in record["tests"])
        lines.append(f"{record['process']:10s} {cpu:7.1f} {len(record['tests']):6d} {busy:12.1f}")
    lines.append(f"files by CPU (own + children), top {top}:")
    lines += [f"  {c:6.1f} CPU s {w:6.1f} wall s {n:5d}  {f}" for f, c, w, n in by_file(run)[:top]]
    lines.append("tests that wait (wall - CPU):")
    lines += [f"  {gap:5.2f} s  {name[:110]}" for name, gap in waiting(run)[:10]]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    runs = []
    for index in range(args.repeat):
        runs.append(run_suite(args.pytest_args))
        print(f"run {index + 1}: pytest {runs[-1]['pytest_s']:.1f} s", flush=True)
    median = sorted(runs, key=lambda r: r["pytest_s"])[len(runs) // 2]
    print("\n".join(report(median, args.top)))
    figures = [r["pytest_s"] for r in runs]
    print(
        f"pytest seconds: median {statistics.median(figures):.1f} (runs: "
        + ", ".join(f"{f:.1f}" for f in figures)
        + f"); target < {TARGET_S:.0f} s; {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
