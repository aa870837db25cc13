"""What "why this layout" costs (issue 24): the time the alternatives take inside a solve
(``SolveResult.alternatives.time_s``) against the search itself (``solve_time_s``), in-process,
and how they were found.

    python benchmarks/why_layout.py [--repeat 3]

Medians of ``--repeat`` solves (``top=5``, as the CLI). The in-call times are measured by the
solve itself, so a loaded machine moves both columns alike.
"""

from __future__ import annotations

import argparse
import statistics

from autopar import api

CASES = (
    ("llama-70b", 1024, {}),  # the README's main command
    ("llama-8b", 64, {}),
    ("llama-405b", 16384, {"seq_len": 8192, "global_batch": 2048, "uneven_pipeline": True}),
    ("deepseek-v3", 2048, {}),
    ("mixtral-8x22b", 1024, {}),
    ("qwen3-30b-a3b", 256, {"time_limit": 60.0}),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'case':<22} {'layouts':>9} {'search s':>9} {'why s':>7} {'extra':>6}  method")
    for model, gpus, extra in CASES:
        extra = dict(extra)
        limit = extra.pop("time_limit", 10.0)
        problem = api.make_problem(model=model, gpus=gpus, **extra)
        runs = [
            api.solve_problem(problem, top=5, time_limit=limit, alternatives=True)
            for _ in range(args.repeat)
        ]
        if runs[0].alternatives is None:
            print(f"{model} @ {gpus:<12} no layout ({runs[0].status})")
            continue
        search = statistics.median(r.solve_time_s for r in runs)
        why = statistics.median(r.alternatives.time_s for r in runs)
        found = runs[0].alternatives
        layouts = f"{found.layouts:,}" if found.layouts else "-"
        cut = sum(item.outcome == "cut short" for item in found.items)
        print(
            f"{model + ' @ ' + str(gpus):<22} {layouts:>9} {search:9.2f} {why:7.2f} "
            f"{why / search:6.0%}  {found.method}" + (f", {cut} axes cut short" if cut else "")
        )


if __name__ == "__main__":
    main()
