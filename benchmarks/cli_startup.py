"""The command line end to end against importing OR-Tools (issue 19's yardstick).

Times, as whole processes and in turn (A B A B ...), ``autopar solve --gpus 1024 --model
llama-70b`` (the README's command, default text answer) and ``python -c "import
ortools.sat.python.cp_model"``, and prints each one's median wall and CPU seconds and their
ratio (target: the solve within 1.5x of the import). CPU is the children's user + system time
from ``os.wait4``; wall is ``time.perf_counter`` around each run. Run it on an idle machine
for absolute figures; on a shared one read the ratios (each pair runs in the same minute).

    python benchmarks/cli_startup.py [--repeat 7] [-- OTHER AUTOPAR ARGS]

Bytecode: both commands read compiled modules (an installed package has them); a checkout run
with ``PYTHONDONTWRITEBYTECODE=1`` and no ``__pycache__`` compiles autopar's ~100 modules on
every start instead (about 0.3 s more per command), so the script compiles them first.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOLVE = ["solve", "--gpus", "1024", "--model", "llama-70b"]
YARDSTICK = [sys.executable, "-c", "import ortools.sat.python.cp_model"]
TARGET = 1.5
HEAVY = ("ortools", "pandas", "autopar.search.prove", "autopar.calibration", "autopar.sweeps")


def run_once(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run of ``argv``, its output discarded."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed")
    return wall, usage.ru_utime + usage.ru_stime


def loaded_modules(args: list[str]) -> list[str]:
    """Which of ``HEAVY`` the solve imports (run in-process once)."""
    code = (
        "import contextlib, io, sys\n"
        "from autopar.cli import main\n"
        f"sys.argv = ['autopar', *{args!r}]\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main()\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("args", nargs="*", help="autopar arguments instead of the README's solve")
    options = parser.parse_args()
    args = options.args or SOLVE
    compileall.compile_dir(REPO / "autopar", quiet=1)
    compileall.compile_dir(REPO / "cost_models", quiet=1)
    solve = [sys.executable, "-m", "autopar", *args]
    for argv in (YARDSTICK, solve):  # warm-up: the page cache, not counted
        run_once(argv)
    pairs = [(run_once(YARDSTICK), run_once(solve)) for _ in range(options.repeat)]
    base_wall = statistics.median(b[0] for b, _ in pairs)
    base_cpu = statistics.median(b[1] for b, _ in pairs)
    wall = statistics.median(a[0] for _, a in pairs)
    cpu = statistics.median(a[1] for _, a in pairs)
    ratio_wall = statistics.median(a[0] / b[0] for b, a in pairs)
    ratio_cpu = statistics.median(a[1] / b[1] for b, a in pairs)
    load = os.getloadavg()[0]
    print(f"{options.repeat} runs each, in turn; load average {load:.1f}; medians")
    print(f"import cp_model:      wall {base_wall:.3f} s   cpu {base_cpu:.3f} s")
    print(f"autopar {' '.join(args)}: wall {wall:.3f} s   cpu {cpu:.3f} s")
    print(
        f"ratio (pair by pair): wall {ratio_wall:.2f}x   cpu {ratio_cpu:.2f}x (target <= {TARGET}x)"
    )
    print(f"the solve loads: {' '.join(loaded_modules(args)) or 'none of ' + ', '.join(HEAVY)}")


if __name__ == "__main__":
    main()
