"""Pipeline schedules (issue 23): the published bubble and memory tables, the predicted gains,
and the solve time with the schedule axis.

    python benchmarks/schedules.py [--part tables|gains|solve|paired] [--repeat R]

- ``tables``: each schedule simulated (``autopar.costs.schedule``) with equal forward,
  input-gradient and weight-gradient times beside the closed forms the sources print: the
  DualPipe README / DeepSeek-V3 report Table 2 (1F1B, ZB1P, DualPipe, DualPipeV: bubble,
  parameters and activations per device) and the zero-bubble authors' README (1F1B, ZB1P,
  ZBV bubble rates and activation memory); then the same schedules at the phase times the cost
  model gives a real layer, where the closed forms no longer hold.
- ``gains``: per model, the best layout with the 1F1B schedules only (``--pipeline-schedule
  1f1b``: interleaved where VPP > 1) against every schedule the framework ships (``any``), for
  Megatron-LM and torchtitan; and at one pipelined layout per model, every schedule against
  interleaved 1F1B on the same layout.
- ``solve``: in-process solve time (median of ``--repeat``) of Llama-3 70B on 1024 H100 and
  DeepSeek-V3 on 2048 H100, default schedules against ``--pipeline-schedule any``.
- ``paired`` (not in the default parts): the same cases' CPU time, default and ``any``
  alternated, the median of the pairs' ratios (the figures of benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

from autopar import api
from autopar.costs.estimate import estimate
from autopar.costs.plugin import load_cost_model
from autopar.costs.schedule import simulate
from autopar.costs.schedule_slots import in_flight_chunks
from autopar.costs.terms import grid_of, microbatch_phases, sum_phases
from autopar.inputs.frameworks import FRAMEWORK_SCHEDULES
from autopar.layout.plan import Layout

GAIN_CASES = {
    "Llama-3 70B, 1024 H100, seq 8192, GBS 1024": (
        dict(model="llama-70b", gpus=1024, seq_len=8192, global_batch=1024),
        dict(tp=8, pp=8, dp=16, vpp=2, grad_accum=64, sequence_parallel=True),
    ),
    "Llama-3 70B, 256 H100, seq 8192, GBS 128": (
        dict(model="llama-70b", gpus=256, seq_len=8192, global_batch=128),
        dict(tp=8, pp=8, dp=4, vpp=2, grad_accum=32, sequence_parallel=True),
    ),
    "Llama-3.1 405B, 16384 H100, seq 8192, GBS 2048": (
        dict(
            model="llama-3.1-405b",
            gpus=16384,
            seq_len=8192,
            global_batch=2048,
            uneven_pipeline=True,
        ),
        dict(tp=8, pp=16, dp=64, cp=2, vpp=2, grad_accum=32, sequence_parallel=True),
    ),
    "DeepSeek-V3, 2048 H100, seq 4096, GBS 8192": (
        dict(model="deepseek-v3", gpus=2048, seq_len=4096, global_batch=8192, uneven_pipeline=True),
        dict(tp=2, pp=8, dp=128, ep=64, vpp=2, grad_accum=64, sequence_parallel=True),
    ),
    "Qwen3-235B-A22B, 1024 H100, seq 4096, GBS 2048": (
        dict(model="qwen3-235b-a22b", gpus=1024, seq_len=4096, global_batch=2048),
        dict(tp=2, pp=8, dp=64, ep=32, vpp=2, grad_accum=32, sequence_parallel=True),
    ),
}
SOLVE_CASES = {
    "Llama-3 70B @ 1024": dict(model="llama-70b", gpus=1024, seq_len=8192, global_batch=1024),
    "DeepSeek-V3 @ 2048": dict(
        model="deepseek-v3", gpus=2048, seq_len=4096, global_batch=8192, uneven_pipeline=True
    ),
}


def _bubble(schedule: str, pp: int, vpp: int, m: int, f: float, b: float, w: float):
    """(makespan bubble, the largest rank's span bubble) in stage times, chunks at 1/vpp."""
    sim = simulate(schedule, pp, vpp, m, f / vpp, b / vpp, w / vpp)
    work = m * (f + b + w)
    span = max(end - start for start, end in sim.spans)
    return sim.step_s - work, span - work


def _held(schedule: str, pp: int, vpp: int, m: int) -> float:
    """The most activations one rank holds, in micro-batch stages (of ``pp*vpp`` stages)."""
    return max(sum(rank) for rank in in_flight_chunks(schedule, pp, vpp, m)) / vpp


def deepseek_bubble(label: str, pp: int, f: float, b: float, w: float) -> float:
    """DeepSeek-V3 Table 2 (DualPipe README) for ``PP`` stages of forward ``f``, whole backward
    ``b`` and weight backward ``w`` each; ``F&B`` a forward and a whole backward issued together
    (nothing hidden: the sum)."""
    both = f + b
    return {
        "1F1B": (pp - 1) * (f + b),
        "ZB1P": (pp - 1) * (f + b - 2 * w),
        "DualPipe": (pp / 2 - 1) * (both + b - 3 * w),
        "DualPipeV": (pp / 2 - 1) * (both + b - 3 * w),
    }[label]


def tables() -> None:
    t = 1.0
    print("DeepSeek-V3 Table 2 / DualPipe README, F = B_input = W = 1 (B = 2 whole backward):")
    print("  PP  schedule      bubble (sim)  bubble (source)     params  activations (sim/source)")
    for pp in (4, 8, 16):
        m = 4 * pp
        rows = [
            ("1F1B", "1f1b", pp, 1, deepseek_bubble("1F1B", pp, t, 2 * t, t), "1x", pp),
            ("ZB1P", "zb-h1", pp, 1, deepseek_bubble("ZB1P", pp, t, 2 * t, t), "1x", pp),
            (
                "DualPipe",
                "dualpipe",
                pp,
                1,
                deepseek_bubble("DualPipe", pp, t, 2 * t, t),
                "2x",
                pp + 1,
            ),
            # DualPipeV: the PP stages on PP/2 devices, each stage half a device's layers
            (
                "DualPipeV",
                "dualpipe-v",
                pp // 2,
                2,
                deepseek_bubble("DualPipeV", pp, t / 2, t, t / 2),
                "2x of PP/2",
                pp + 1,
            ),
        ]
        for label, name, ranks, vpp, source, params, acts in rows:
            bubble, _ = _bubble(name, ranks, vpp, m, t, t, t)
            held = _held(name, ranks, vpp, m) * (vpp if name == "dualpipe-v" else 1)
            print(
                f"  {pp:>2}  {label:<12} {bubble:>8.2f}      {source:>8.2f}            "
                f"{params:<11} {held:g} / {acts}"
            )
    print("\nZero-bubble README (T_F = T_B = T_W): bubble rate = bubble / step, and the bubble")
    print("over 1F1B's; the source's ZB1P 'B/3' is a third of 1F1B's bubble, its ZBV '0' a rank's")
    print("own span (its optimizer post-validation lets a rank run on into the next step)")
    print("  p   m   schedule  rate (makespan)  rate (rank span)  bubble / 1F1B's  source")
    for pp, m in ((8, 24), (8, 64), (16, 48), (32, 96)):
        base = (pp - 1) / (m + pp - 1)
        reference = _bubble("1f1b", pp, 1, m, t, t, t)[0]
        for label, name, vpp, source in (
            ("1F1B", "1f1b", 1, f"(p-1)/(m+p-1) = {base:.4f}"),
            ("ZB1P", "zb-h1", 1, "B/3"),
            ("ZBV", "zb-v", 2, "0"),
        ):
            bubble, span = _bubble(name, pp, vpp, m, t, t, t)
            step = m * 3 * t
            print(
                f"  {pp:<3} {m:<3} {label:<8}  {bubble / (step + bubble):.4f}           "
                f"{span / (step + span):.4f}            {span / reference:.4f}           {source}"
            )
    _real_times()


def _real_times() -> None:
    """The schedules at the phase times of Llama-3 70B's stage (TP 8, PP 8, seq 8192)."""
    problem = api.make_problem(model="llama-70b", gpus=64, seq_len=8192, global_batch=64)
    layout = Layout(tp=8, pp=8, dp=1, vpp=2, grad_accum=64, sequence_parallel=True)
    ctx, cm = api.make_context(problem), load_cost_model(None)
    grid = grid_of([layout])
    phases = sum_phases(microbatch_phases(cm, grid, ctx), 1)
    f, b, w = (float(x[0]) for x in phases[:3])
    print(
        f"\nLlama-3 70B stage (TP 8, PP 8, seq 8192): F {f * 1e3:.0f} ms, B {b * 1e3:.0f} ms, "
        f"W {w * 1e3:.0f} ms per micro-batch; bubble in stage times (F+B+W = 1), m = 64:"
    )
    total = f + b + w
    for name, vpp, closed in (
        ("1f1b", 1, (8 - 1) * 1.0),
        ("1f1b", 2, (8 - 1) / 2),
        ("zb-h1", 2, (8 - 1) / 2 * (f + b - w) / total),
        ("zb-v", 2, None),
        ("dualpipe-v", 2, None),
    ):
        bubble, span = _bubble(name, 8, vpp, 64, f / total, b / total, w / total)
        label = f"{name} vpp {vpp}"
        shown = "-" if closed is None else f"{closed:.3f}"
        print(f"  {label:<18} makespan {bubble:.3f}  rank span {span:.3f}  closed form {shown}")


def _solve(options: dict, schedule: str):
    try:
        return api.solve(pipeline_schedule=schedule, time_limit=60, **options).best
    except Exception as err:  # an infeasible case prints its reason and the table goes on
        print(f"    {schedule}: {type(err).__name__}: {str(err)[:90]}")
        return None


def gains() -> None:
    for name, (options, pinned) in GAIN_CASES.items():
        print(f"== {name}")
        for framework in ("megatron", "torchtitan"):
            kw = {**options, "framework": framework}
            one, best = _solve(kw, "1f1b"), _solve(kw, "any")
            if one and best:
                gain = one.step_time_s / best.step_time_s - 1
                print(
                    f"  {framework:<10} optimum, 1f1b {one.step_time_s:.3f} s -> any "
                    f"{best.step_time_s:.3f} s ({gain:+.1%}) {best.layout.text()}"
                )
        _same_layout(options, pinned)


def _same_layout(options: dict, pinned: dict) -> None:
    """Every schedule on one pipelined layout (the ones that layout admits), against the
    interleaved 1F1B on it."""
    for framework in ("megatron", "torchtitan"):
        zero = 1 if framework == "megatron" else 0
        problem = api.make_problem(**{**options, "uneven_pipeline": True}, framework=framework)
        ctx, cm = api.make_context(problem), load_cost_model(None)
        results = {}
        for schedule, _ in FRAMEWORK_SCHEDULES[framework]:
            vpp = 1 if schedule == "gpipe" else pinned["vpp"]
            lay = Layout(**{**pinned, "vpp": vpp}, zero=zero, pipeline_schedule=schedule)
            broken = api.build_space(problem).broken_rule(lay.grid_row(), skip=("pins and limits",))
            if broken is None:
                results[schedule] = estimate(lay, ctx, cm)
        base = results.get("1f1b")
        if base is None:
            print(f"  {framework:<10} the rules refuse {Layout(**pinned).text()}")
            continue
        parts = [
            f"{s} {e.step_time_s:.3f} s ({base.step_time_s / e.step_time_s - 1:+.1%}, "
            f"bubble {e.bubble_fraction:.1%}, {e.memory_bytes['total'] / 2**30:.0f} GiB)"
            for s, e in results.items()
        ]
        print(f"  {framework:<10} at {base.layout.text()}:")
        for part in parts:
            print(f"      {part}")


def solve(repeat: int) -> None:
    for name, options in SOLVE_CASES.items():
        for framework in ("megatron", "torchtitan"):
            figures = []
            for schedule in (None, "any"):
                kw = {**options, "framework": framework}
                if schedule:
                    kw["pipeline_schedule"] = schedule
                times, result = [], None
                for _ in range(repeat):
                    start = time.perf_counter()
                    result = api.solve(time_limit=60, **kw)
                    times.append(time.perf_counter() - start)
                figures.append((statistics.median(times), result))
            (t0, r0), (t1, r1) = figures
            print(
                f"{name:<20} {framework:<10} default {t0:.2f} s ({r0.status}), any {t1:.2f} s "
                f"({r1.status}): {t1 / t0:.2f}x; any picks {r1.best.layout.text()}"
            )


def paired(repeat: int) -> None:
    """CPU time in process, default and ``any`` alternated ``repeat`` times after a warm-up:
    the median of the pairs' ratios (a shared machine's load moves both of a pair alike)."""

    def cpu_s(kw: dict) -> float:
        start = time.process_time()
        api.solve(time_limit=60, **kw)
        return time.process_time() - start

    for name, options in SOLVE_CASES.items():
        for framework in ("megatron", "torchtitan"):
            default = {**options, "framework": framework}
            searched = {**default, "pipeline_schedule": "any"}
            cpu_s(default), cpu_s(searched)
            pairs = [(cpu_s(default), cpu_s(searched)) for _ in range(repeat)]
            ratios = [b / a for a, b in pairs]
            print(
                f"{name:<20} {framework:<10} default {statistics.median(a for a, _ in pairs):.3f}"
                f" s, any {statistics.median(b for _, b in pairs):.3f} s CPU: "
                f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("tables", "gains", "solve", "paired"), action="append")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    parts = args.part or ["tables", "gains", "solve"]
    if "tables" in parts:
        tables()
    if "gains" in parts:
        gains()
    if "solve" in parts:
        solve(args.repeat)
    if "paired" in parts:
        paired(args.repeat)


if __name__ == "__main__":
    main()
