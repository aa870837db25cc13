"""Per-stage pipeline plans (issue 13): proof time, the space covered, and the predicted gains.

    python benchmarks/stage_plans.py [--workers N] [--case N ...] [--time-limit S]

For each case it prints

- the per-stage optimum (``autopar solve --pipeline-plan per-stage``): outer layout, plan,
  status and time to the proof, with the outer layouts left after the bounds;
- the size of the space covered: per outer layout, the chunk splits (compositions of the layers
  into ``pp*vpp`` chunks, the middle ones non-empty) times the recompute choices
  (``none | selective | full:k`` per stage), summed, and the time numpy brute force would need
  at the measured cost of scoring one plan;
- the step time of: the best uniform layout (the default cost model and solver); that layout
  scored by the per-stage model with Megatron's even split and with its
  ``--account-for-embedding/loss-in-pipeline-split`` split (the embedding and the loss each
  counted as a layer); the per-stage optimum; and the gains of the last over the others;
Every per-stage step time is Megatron's schedule simulated (``autopar.costs.schedule``, backward
twice the forward); the search ranks by the schedule formula, whose value is printed beside it, and
the answer is the faster by the simulation of the search's plan and the best even splits.
"""

from __future__ import annotations

import argparse
import math
import time

from autopar import api
from autopar.api import make_context
from autopar.base.axes import GRID_AXES
from autopar.costs.plugin import load_cost_model
from autopar.costs.stage_costs import probe_stage_costs
from autopar.costs.stage_estimate import estimate_plan
from autopar.costs.stage_figures import stage_figures
from autopar.costs.terms import grid_of
from autopar.layout.stages import StagePlan, StageRecompute, even_plan
from autopar.pipeline.candidates import per_stage_space
from autopar.pipeline.result import solve_result

CASES = [
    ("Llama-3.1 405B, 16384 H100", dict(model="llama-3.1-405b", gpus=16384, global_batch=2048)),
    ("Llama-3 70B, 1024 H100", dict(model="llama-70b", gpus=1024, global_batch=1024)),
    ("Llama-3 70B, 1024 H100", dict(model="llama-70b", gpus=1024, global_batch=256, seq_len=32768)),
    ("Llama-3.1 405B, 2048 H100", dict(model="llama-3.1-405b", gpus=2048, global_batch=512)),
    (
        "DeepSeek-V3, 2048 H100",
        dict(model="deepseek-v3", gpus=2048, global_batch=8192, seq_len=4096),
    ),
]
TIME_LIMIT_S = 10.0
SEQ_LEN = 8192


def space_size(problem) -> tuple[float, int]:
    """(log10 of the plans covered, outer layouts): sum over outer layouts of chunk splits times
    recompute choices per stage."""
    grid = per_stage_space(problem).pruned_grid(GRID_AXES)
    num_layers = problem.model.num_layers
    total = 0.0
    for p, v in zip(grid["pp"], grid["vpp"], strict=True):
        chunks = int(p * v)
        middle = max(chunks - 2, 0)
        free = num_layers - middle  # layers left once every middle chunk holds one
        splits = math.comb(free + chunks - 1, chunks - 1) if free >= 0 else 0
        per_stage = 2 + max(1, math.ceil(num_layers / chunks))  # none, selective, full:1..k
        total += splits * float(per_stage) ** int(p)
    return math.log10(total) if total else 0.0, len(grid["pp"])


def seconds_per_plan(problem, layout) -> float:
    """Numpy time to score one plan on one outer layout (vectorised over 2000 layouts)."""
    ctx, cm = make_context(problem), load_cost_model(None)
    grid = grid_of([layout] * 2000)
    costs = probe_stage_costs(cm, ctx, grid)
    plan = even_plan(problem.model.num_layers, layout.pp, layout.vpp, StageRecompute())
    start = time.perf_counter()
    for _ in range(5):
        stage_figures(plan, costs, grid["grad_accum"])
    return (time.perf_counter() - start) / (5 * 2000)


def account_for_plan(num_layers: int, pp: int, vpp: int, recompute: StageRecompute) -> StagePlan:
    """Megatron ``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``:
    ``L + 2`` slots split evenly over the ``pp*vpp`` virtual stages, the first holding the
    embedding in one slot and the last the loss (transformer_block.py get_num_layers_to_build);
    when ``L + 2`` does not divide, the remainder goes to the middle chunks."""
    chunks = pp * vpp
    slots = num_layers + 2
    base, extra = divmod(slots, chunks)
    layers = [base] * chunks
    for c in range(1, 1 + extra):
        layers[c % chunks] += 1
    layers[0] -= 1
    layers[-1] -= 1
    return StagePlan(pp=pp, vpp=vpp, chunk_layers=tuple(layers), recompute=(recompute,) * pp)


def run(name: str, options: dict, workers: int, time_limit_s: float = TIME_LIMIT_S) -> None:
    options = {"seq_len": SEQ_LEN, **options}
    problem = api.make_problem(**options)
    ctx, cm = make_context(problem), load_cost_model(None)
    start = time.perf_counter()
    staged = solve_result(problem, ctx, cm, time_limit_s=time_limit_s, num_workers=workers)
    staged_s = time.perf_counter() - start
    uniform_options = dict(options)
    if problem.model.num_layers % 8:
        uniform_options["uneven_pipeline"] = True
    uniform = api.solve(**uniform_options, num_workers=workers)
    if not staged.layouts:
        print(f"== {name}: per-stage {staged.status} in {staged_s:.2f} s ({staged.notes[0]})\n")
        return
    best = staged.best
    lay = uniform.best.layout
    rec = StageRecompute(lay.recompute, problem.model.num_layers if lay.recompute == "full" else 0)
    even = estimate_plan(lay, even_plan(problem.model.num_layers, lay.pp, lay.vpp, rec), ctx, cm)
    account = estimate_plan(
        lay, account_for_plan(problem.model.num_layers, lay.pp, lay.vpp, rec), ctx, cm
    )
    log_plans, rows = space_size(problem)
    per_plan = seconds_per_plan(problem, best.layout)
    brute_years = 10**log_plans * per_plan / (3600 * 24 * 365)
    print(f"== {name}, seq {options['seq_len']}, global batch {options['global_batch']}")
    print(f"per-stage   {staged.status} in {staged_s:.2f} s ({staged.notes[0]})")
    print(f"            {best.layout.text()}")
    print(f"            {best.per_stage.plan.text()}")
    print(
        f"space       {rows} outer layouts, 10^{log_plans:.0f} plans; brute force at "
        f"{per_plan * 1e6:.1f} us/plan: 10^{math.log10(max(brute_years, 1e-30)):.0f} years"
    )
    print(
        f"uniform     {uniform.best.step_time_s:.3f} s  {lay.text()} ({uniform.solve_time_s:.2f} s)"
    )
    print(f"  even      {even.step_time_s:.3f} s  (per-stage model, Megatron's even split)")
    print(f"  account   {account.step_time_s:.3f} s  (account-for-embedding/loss split)")
    chosen = best.per_stage
    print(
        f"per-stage   {best.step_time_s:.3f} s  MFU {best.mfu:.1%} "
        f"(the {chosen.plan_from}'s plan; formula {chosen.formula_step_time_s:.3f} s)"
    )
    print(
        f"gain        {uniform.best.step_time_s / best.step_time_s - 1:+.1%} over the uniform "
        f"optimum, {even.step_time_s / best.step_time_s - 1:+.1%} over its even split, "
        f"{account.step_time_s / best.step_time_s - 1:+.1%} over account-for-embedding/loss"
    )
    for note in staged.notes[-2:]:
        print(f"schedule    {note}")
    # The plan alone (AdaPipe's setting): the uniform optimum's outer layout pinned.
    pins = {a: getattr(lay, a) for a in ("tp", "pp", "cp", "vpp", "mbs")}
    pinned_problem = api.make_problem(**options, **pins)
    pinned = solve_result(
        pinned_problem,
        make_context(pinned_problem),
        cm,
        time_limit_s=time_limit_s,
        num_workers=workers,
    )
    if pinned.layouts:
        plan_only = pinned.best
        print(
            f"plan only   {plan_only.step_time_s:.3f} s on the uniform optimum's layout "
            f"({pinned.status}, {pinned.solve_time_s:.2f} s): "
            f"{even.step_time_s / plan_only.step_time_s - 1:+.1%} over its even split; "
            f"{plan_only.per_stage.plan.text()[:160]}"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--time-limit", type=float, default=TIME_LIMIT_S, help="per solve (a loaded machine)"
    )
    parser.add_argument("--case", type=int, action="append", help="run only these (0-based)")
    args = parser.parse_args()
    for i, (name, options) in enumerate(CASES):
        if args.case is None or i in args.case:
            run(name, options, args.workers, args.time_limit)


if __name__ == "__main__":
    main()
