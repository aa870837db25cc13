"""Wall time of a 1,000-point ``autopar.sweeps.run`` with ``--jobs 1`` and ``--jobs 2`` (issue 14
target: jobs 2 <= 0.6x jobs 1 on 2 cores), and whether both give the same rows.

    python benchmarks/sweep_jobs.py [--points 1000] [--rounds 10]

The grid is Llama-3 8B on 125 GPU counts (8, 16, ... 1000) x 4 GPU types x 2 sequence lengths;
each point is a full solve (no pins); with ``jobs=2`` each solve gets ``cores // 2`` CP-SAT
workers. On a shared machine the load changes within minutes, so the grid is cut into
``rounds`` slices and each slice is swept with both settings back to back (order alternating):
both totals then see the same load.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import autopar

GPU_TYPES = ("h100", "h200", "b200", "a100-80gb")
SEQ_LENS = (2048, 4096)


def grid(points: int) -> list[int]:
    return [8 * (i + 1) for i in range(points // (len(GPU_TYPES) * len(SEQ_LENS)))]


def _cpu_s() -> float:
    """CPU seconds of this process (CP-SAT threads included) and of its reaped workers."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def sweep(counts: list[int], jobs: int):
    start, cpu = time.perf_counter(), _cpu_s()
    result = autopar.sweep(
        model="llama-8b",
        gpus=counts,
        gpu=list(GPU_TYPES),
        seq_len=list(SEQ_LENS),
        global_batch_tokens=4 * 2**20,
        jobs=jobs,
    )
    return result, time.perf_counter() - start, _cpu_s() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    counts = grid(args.points)
    total, cpu = {1: 0.0, 2: 0.0}, {1: 0.0, 2: 0.0}
    rows: dict[int, list] = {1: [], 2: []}
    for r in range(args.rounds):
        part = counts[r :: args.rounds]
        for jobs in (1, 2) if r % 2 == 0 else (2, 1):
            result, seconds, cpu_s = sweep(part, jobs)
            total[jobs] += seconds
            cpu[jobs] += cpu_s
            rows[jobs] += list(result.rows)
        print(
            f"round {r + 1}/{args.rounds}: jobs=1 {total[1]:.1f} s, jobs=2 {total[2]:.1f} s "
            f"so far; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    n = len(rows[1])
    status = sum(a.status != b.status for a, b in zip(rows[1], rows[2], strict=True))
    worst = max(
        abs(a.step_time_s / b.step_time_s - 1)
        for a, b in zip(rows[1], rows[2], strict=True)
        if a.step_time_s > 0
    )
    print(
        f"{n} points, {os.cpu_count()} cores: jobs=1 {total[1]:.1f} s "
        f"({total[1] / n * 1000:.0f} ms/point), jobs=2 {total[2]:.1f} s "
        f"({total[2] / n * 1000:.0f} ms/point): jobs=2 takes {total[2] / total[1]:.2f}x; "
        f"status differs at {status} points, step time by <= {worst:.2%}"
    )
    # Without other load, jobs=1 takes at most its CPU time (more threads only shorten it) and
    # jobs=2 at least half of its own: a lower bound on the ratio an idle machine would show.
    print(
        f"CPU seconds: jobs=1 {cpu[1]:.1f} (of {total[1]:.1f} s wall), jobs=2 {cpu[2]:.1f} "
        f"(of {total[2]:.1f} s); on {os.cpu_count()} idle cores jobs=2 / jobs=1 >= "
        f"{cpu[2] / os.cpu_count() / cpu[1]:.2f}"
    )


if __name__ == "__main__":
    main()
