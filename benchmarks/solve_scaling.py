"""Time to a proven optimum vs GPU count, against brute-force enumeration of the same space.

    python benchmarks/solve_scaling.py [--workers N] [--repeat R]

For each case it prints: the table rows CP-SAT sees, the solve time after imports (model build +
CP-SAT + tie enumeration + float re-evaluation), the status, the time numpy takes to enumerate and
score every layout of the same space (tests/oracle.py does the same), their ratio, and whether both
agree on the optimum. Then the end-to-end CLI time against the time of importing CP-SAT alone.
Targets (issue 4, on a 2-core machine): Llama-70B at 1024 GPUs under 0.5 s; 98304 GPUs under 5 s;
`autopar solve --gpus 1024 --model llama-70b` within 2x of importing ortools' cp_model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np

from autopar.api import make_context, make_problem
from autopar.base.axes import GRID_AXES
from autopar.costs.plugin import load_cost_model
from autopar.costs.terms import memory_bytes, step_time_s
from autopar.layout.space import build_space
from autopar.search.solver import solve_space

CASES = [("llama-70b", n, 8192, {}) for n in (64, 256, 1024, 4096, 16384, 65536, 98304, 131072)]
CASES += [
    ("llama-3.1-405b", 16384, 8192, {}),
    ("llama-3.1-405b", 16384, 8192, {"uneven_pipeline": True}),
    ("mixtral-8x22b", 4096, 4096, {}),
    # issue 12: today's MoE models (DeepSeek-V3's 61 layers split over PP only unevenly)
    ("deepseek-v3", 2048, 4096, {"uneven_pipeline": True}),
    ("qwen3-235b-a22b", 1024, 4096, {}),
    ("qwen3-30b-a3b", 256, 4096, {}),
]


def global_batch(num_gpus: int) -> int:
    """Sequences per step: 1024, or one per 8 GPUs at scale (Llama 3 405B used 2048 x 8192 tokens
    on 16k GPUs; a DP size must divide the batch)."""
    return max(1024, num_gpus // 8)


def brute_force_s(problem, ctx, cost_model) -> tuple[float, float]:
    """Seconds to enumerate and score every layout in numpy, and the best step time found."""
    start = time.perf_counter()
    grid = build_space(problem).pruned_grid(GRID_AXES)
    times = step_time_s(cost_model, grid, ctx)
    fits = memory_bytes(cost_model, grid, ctx) <= ctx.cluster.usable_memory_bytes
    best = float(times[fits].min()) if fits.any() else float("inf")
    return time.perf_counter() - start, best


def run_case(
    model: str, gpus: int, seq_len: int, options: dict, workers: int | None, repeat: int
) -> dict:
    problem = make_problem(
        model=model, gpus=gpus, seq_len=seq_len, global_batch=global_batch(gpus), **options
    )
    cost_model, ctx = load_cost_model(None), make_context(problem)
    solve_s = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = solve_space(build_space(problem), ctx, cost_model, num_workers=workers)
        solve_s.append(time.perf_counter() - start)
    brute_s, brute_best = brute_force_s(problem, ctx, cost_model)
    best = result.best.step_time_s if result.layouts else float("inf")
    return {
        "case": f"{model} @ {gpus}" + (" uneven" if options else ""),
        "solve_s": float(np.median(solve_s)),
        "status": result.status,
        "brute_s": brute_s,
        "ratio": brute_s / float(np.median(solve_s)),
        "agree": best == brute_best or abs(best - brute_best) <= 2e-5 + 1e-9 * brute_best,
        "layouts": len(build_space(problem).pruned_grid(GRID_AXES)["tp"]),
    }


def wall_s(argv: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        runs.append(time.perf_counter() - start)
    return float(np.median(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{'case':<31} {'layouts':>9} {'solve s':>8} {'status':>8} {'brute s':>8} "
        f"{'brute/solve':>11} {'agree':>5}"
    )
    for model, gpus, seq_len, options in CASES:
        row = run_case(model, gpus, seq_len, options, args.workers, args.repeat)
        print(
            f"{row['case']:<31} {row['layouts']:>9,} {row['solve_s']:>8.3f} {row['status']:>8} "
            f"{row['brute_s']:>8.3f} {row['ratio']:>11.2f} {str(row['agree']):>5}"
        )
    python = sys.executable
    base = wall_s([python, "-c", "from ortools.sat.python import cp_model"], args.repeat)
    cli = wall_s(
        [python, "-m", "autopar", "solve", "--gpus", "1024", "--model", "llama-70b"], args.repeat
    )
    print(
        f"\nimport cp_model: {base:.2f} s   autopar solve --gpus 1024 --model llama-70b: "
        f"{cli:.2f} s   ratio {cli / base:.2f} (target <= 2)"
    )


if __name__ == "__main__":
    main()
