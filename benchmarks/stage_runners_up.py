"""Per-stage runners-up (issue 19): time to the ``--top`` best per-stage layouts, in-process.

    python benchmarks/stage_runners_up.py [--case N ...] [--top N ...] [--repeat R]

For each case (those of ``benchmarks/stage_plans.py``; by default the first, Llama-3.1 405B on
16,384 H100s) and each ``--top`` (default 1 and the CLI's default, 5) it runs
``autopar.solve_problem(problem, top=N, pipeline_plan="per-stage")`` with the CLI's default time
limit (10 s) and prints the median wall time over ``--repeat`` runs, how many of the N layouts
the search returned, their statuses and their steps by the schedule formula. The runners-up
share the bounds and tables of the first solve (``autopar.pipeline.search.SearchState``), so
``--top 5`` should cost little more than ``--top 1``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from stage_plans import CASES, SEQ_LEN  # this folder is on sys.path

from autopar import api

TOPS = (1, 5)
"""``--top 1`` and the CLI's default ``--top``."""


def run(name: str, options: dict, top: int, repeat: int) -> None:
    problem = api.make_problem(**{"seq_len": SEQ_LEN, **options})
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = api.solve_problem(problem, top=top, pipeline_plan="per-stage")
        times.append(time.perf_counter() - start)
    searched = [e for e in result.layouts if e.per_stage.plan_from == "search"]
    steps = sorted(e.per_stage.formula_step_time_s for e in searched)
    statuses = next((n for n in result.notes if n.startswith("runners-up")), "")
    short = [n for n in result.notes if "layouts asked for" in n]
    print(
        f"{name:34s} --top {top}: {statistics.median(times):6.2f} s "
        f"(min {min(times):.2f}, max {max(times):.2f}); {len(searched)} of {top} layouts, "
        f"{result.status}; formula steps {' '.join(f'{s:.3f}' for s in steps)}"
        + (f"; {statuses}" if statuses else "")
        + (f"; {short[0]}" if short else ""),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", type=int, action="append", help="cases to run (0-based)")
    parser.add_argument("--top", type=int, action="append", help=f"default {TOPS}")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for i in args.case or [0]:
        name, options = CASES[i]
        for top in args.top or TOPS:
            run(name, options, top, args.repeat)


if __name__ == "__main__":
    main()
