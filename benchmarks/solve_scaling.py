"""Time to a proven optimum vs GPU count, against brute-force enumeration of the same space.

    python benchmarks/solve_scaling.py [--workers N] [--repeat R] [--cpsat]

For each case it prints: the layouts of the space (every split Megatron accepts, issue 21), the
solve time after imports (every layout scored, autopar.costs.score, then the runners-up and the
float re-evaluation), the status, with --cpsat the time CP-SAT takes to prove the same optimum
(method "cp-sat", no hint), the time numpy takes to enumerate and score every layout on the full
grid (tests/oracle.py does the same), and whether all agree on the optimum. Then the end-to-end
CLI time against the time of importing CP-SAT alone.
Targets (issue 4, on a 2-core machine): Llama-70B at 1024 GPUs under 0.5 s; 98304 GPUs under 5 s;
`autopar solve --gpus 1024 --model llama-70b` within 2x of importing ortools' cp_model. Issue 21:
DeepSeek-V3 on 2048 H100s (GBS 8192) and Llama-3.1 405B on 16384 (seq 8192, GBS 2048) find their
uneven-pipeline optimum by default; Llama-3 70B on 1024 stays well under a second.
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
    ("llama-3.1-405b", 16384, 8192, {"global_batch": 2048}),
    ("llama-3.1-405b", 16384, 8192, {"global_batch": 2048, "uneven_pipeline": False}),
    ("mixtral-8x22b", 4096, 4096, {}),
    # issue 12: today's MoE models (DeepSeek-V3's 61 layers split over PP only unevenly)
    ("deepseek-v3", 2048, 4096, {"global_batch": 8192}),
    ("qwen3-235b-a22b", 1024, 4096, {}),
    ("qwen3-30b-a3b", 256, 4096, {}),
    ("llama-4-scout", 256, 4096, {}),
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
    model: str,
    gpus: int,
    seq_len: int,
    options: dict,
    workers: int | None,
    repeat: int,
    *,
    cpsat: bool = False,
) -> dict:
    options = {"global_batch": global_batch(gpus), **options}
    problem = make_problem(model=model, gpus=gpus, seq_len=seq_len, **options)
    cost_model, ctx = load_cost_model(None), make_context(problem)
    solve_s = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = solve_space(build_space(problem), ctx, cost_model, num_workers=workers)
        solve_s.append(time.perf_counter() - start)
    cpsat_s, cpsat_best = float("nan"), None
    if cpsat:
        start = time.perf_counter()
        proven = solve_space(
            build_space(problem),
            ctx,
            cost_model,
            num_workers=workers,
            method="cp-sat",
            time_limit_s=600.0,
        )
        cpsat_s = time.perf_counter() - start
        cpsat_best = proven.best.step_time_s if proven.layouts else float("inf")
    brute_s, brute_best = brute_force_s(problem, ctx, cost_model)
    best = result.best.step_time_s if result.layouts else float("inf")
    agree = all(
        b == brute_best or abs(b - brute_best) <= 2e-5 + 1e-9 * brute_best
        for b in (best, *([cpsat_best] if cpsat_best is not None else []))
    )
    even = options.get("uneven_pipeline") is False
    return {
        "case": f"{model} @ {gpus}" + (" even" if even else ""),
        "solve_s": float(np.median(solve_s)),
        "status": result.status,
        "cpsat_s": cpsat_s,
        "brute_s": brute_s,
        "agree": agree,
        "layouts": result.proof.layouts if result.proof else 0,
        "best": result.best.layout.text() if result.layouts else "-",
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
    parser.add_argument("--cpsat", action="store_true", help="also time CP-SAT's proof")
    args = parser.parse_args()
    print(
        f"{'case':<31} {'layouts':>9} {'solve s':>8} {'status':>10} {'cp-sat s':>8} "
        f"{'brute s':>8} {'agree':>5}  best"
    )
    for model, gpus, seq_len, options in CASES:
        row = run_case(model, gpus, seq_len, options, args.workers, args.repeat, cpsat=args.cpsat)
        print(
            f"{row['case']:<31} {row['layouts']:>9,} {row['solve_s']:>8.3f} {row['status']:>10} "
            f"{row['cpsat_s']:>8.2f} {row['brute_s']:>8.3f} {str(row['agree']):>5}  {row['best']}"
        )
    python = sys.executable
    base = wall_s([python, "-c", "from ortools.sat.python import cp_model"], args.repeat)
    cli = wall_s(
        [python, "-m", "autopar", "solve", "--gpus", "1024", "--model", "llama-70b"], args.repeat
    )
    print(
        f"\nimport cp_model: {base:.2f} s   autopar solve --gpus 1024 --model llama-70b: "
        f"{cli:.2f} s   ratio {cli / base:.2f} (target <= 1.5; cli_startup.py pairs the runs)"
    )


if __name__ == "__main__":
    main()
