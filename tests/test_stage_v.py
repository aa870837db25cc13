"""Per-stage plans under the V schedules (issue 23): ZB-V and DualPipeV place chunks ``r`` and
``2*pp-1-r`` on rank ``r`` (torchtitan ``pipeline_module_split``, style ``v``), so the per-rank
times, memories and the simulation are taken on those chunk pairs (``StagePlan.placement``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar import api
from autopar.api import make_context
from autopar.base.errors import InputError
from autopar.costs.plugin import load_cost_model
from autopar.costs.schedule import simulate
from autopar.costs.schedule_orders import rank_steps
from autopar.costs.schedule_slots import in_flight_chunks
from autopar.costs.stage_costs import probe_stage_costs
from autopar.costs.stage_figures import simulated_pipeline_s, stage_figures
from autopar.costs.stage_schedules import stage_schedule
from autopar.costs.terms import grid_of, memory_bytes, step_time_s
from autopar.layout.stages import StagePlan, StageRecompute, even_plan, parse_plan
from autopar.pipeline.result import solve_result
from tests.test_stages import small_problem

LLAMA = dict(model="llama-70b", gpus=1024, seq_len=8192, global_batch=1024)


def test_v_plans_place_chunks_as_torchtitan():
    """torchtitan's V: rank 0 -> (0, 7), 1 -> (1, 6), 2 -> (2, 5), 3 -> (3, 4) for four ranks
    (``pipeline_module_split._get_stage_indices``; its docstring's ZBVZeroBubble example);
    rank 0 holds the last chunk, and a V holds exactly two chunks per rank."""
    rec = (StageRecompute(),) * 4
    plan = StagePlan(pp=4, vpp=2, chunk_layers=(1,) * 8, recompute=rec, placement="v")
    assert [plan.chunks_of(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [plan.rank_of(c) for c in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert plan.last_stage == 0
    loop = dataclasses.replace(plan, placement="loop")
    assert [loop.chunks_of(r) for r in range(4)] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert loop.last_stage == 3
    with pytest.raises(InputError, match="exactly two chunks per rank"):
        StagePlan(pp=2, vpp=4, chunk_layers=(1,) * 8, recompute=rec[:2], placement="v")


def _figures(schedule: str, pp: int, global_batch: int, plan: StagePlan | None = None):
    problem = api.make_problem(**{**LLAMA, "global_batch": global_batch}, framework="torchtitan")
    layout = api.layout_of(
        problem, tp=8, pp=pp, vpp=2, recompute="selective", zero=3, pipeline_schedule=schedule
    )
    ctx, cm = make_context(problem), load_cost_model(None)
    grid = grid_of([layout])
    costs = probe_stage_costs(cm, ctx, grid)
    rec = StageRecompute("selective")
    plan = plan or even_plan(problem.model.num_layers, pp, 2, rec, "v")
    fig = stage_figures(plan, costs, grid["grad_accum"], schedule=stage_schedule(schedule))
    return problem, layout, ctx, cm, grid, costs, plan, fig


@pytest.mark.parametrize(
    ("schedule", "pp", "global_batch"),
    [("zb-v", 4, 1024), ("zb-v", 8, 256), ("dualpipe-v", 4, 1024), ("dualpipe-v", 8, 256)],
)
def test_even_v_split_is_the_uniform_model(schedule, pp, global_batch):
    """The even split in a V: rank 0, which holds the embedding, the output layer and the loss
    and the most micro-batches in flight, holds the uniform model's memory (its V rows put both
    ends on rank 0 too, ``cost_models.memory``); the other ranks less; the in-flight counts are
    the schedule's own order's (``in_flight_chunks``). The simulated step is at least rank 0's
    ``m`` micro-batches and at most the schedule run with rank 0's chunk times on every rank
    (each operation at least as long: the longest path of the fixed order can only grow); the
    uniform step is not a bound (it charges the logits to every rank, and its phases split the
    micro-batch by the terms, the per-stage ones by ``FORWARD_SHARE``)."""
    problem, layout, ctx, cm, grid, costs, plan, fig = _figures(schedule, pp, global_batch)
    uniform_memory = float(memory_bytes(cm, grid, ctx)[0])
    assert fig.memory_bytes[0, 0] == pytest.approx(uniform_memory, rel=1e-9)
    assert (fig.memory_bytes[0, 1:] < uniform_memory).all()
    staged = api.evaluate_problem(problem, layout, plan=plan)
    m = layout.grad_accum
    assert [s.in_flight for s in staged.per_stage.stages] == list(
        in_flight_chunks(schedule, pp, 2, m)
    )
    assert staged.per_stage.stages[0].holds == ("embedding", "loss")
    assert all(not s.holds for s in staged.per_stage.stages[1:])
    pipeline_s = staged.step_time_s - float(costs.step_time_s[0])
    assert pipeline_s >= m * float(fig.time_s[0].max()) * (1 - 1e-12)
    assert float(fig.time_s[0].argmax()) == 0
    worst = [np.broadcast_to(x[0, :1], (pp, 2)) for x in (fig.chunk_forward_s, fig.chunk_weight_s)]
    backward = np.broadcast_to(fig.chunk_backward_s[0, :1], (pp, 2))
    upper = simulate(schedule, pp, 2, m, worst[0], backward - worst[1], worst[1]).step_s
    assert pipeline_s <= upper * (1 + 1e-12)
    assert abs(staged.step_time_s / float(step_time_s(cm, grid, ctx)[0]) - 1) < 0.1


def test_v_memory_is_taken_on_the_chunk_pairs():
    """An uneven V plan: each rank's static bytes are its two chunks' layers (rank 0 with the
    embedding and the output layer), its activations each chunk's layers times that chunk's
    in-flight micro-batches, so the heavy first and last chunks both weigh on rank 0."""
    layers = (14, 8, 8, 10, 10, 8, 8, 14)
    rec = (StageRecompute("selective"),) * 4
    plan = StagePlan(pp=4, vpp=2, chunk_layers=layers, recompute=rec, placement="v")
    *_, costs, _, fig = _figures("zb-v", 4, 1024, plan)
    kind = costs.kinds[0]
    flights = in_flight_chunks("zb-v", 4, 2, 32)
    for r in range(4):
        mine = plan.chunks_of(r)
        static = (
            costs.every_static_bytes[0]
            + sum(layers[c] for c in mine) * costs.static_bytes[kind][0]
            + costs.selective_workspace_bytes[0]
        )
        per_chunk = [layers[c] * costs.activation_bytes[kind][0, 1] for c in mine]
        per_chunk[0] += costs.every_activation_bytes[0]
        if r == 0:
            static += costs.first_static_bytes[0] + costs.last_static_bytes[0]
            per_chunk[0] += costs.first_activation_bytes[0]
            per_chunk[1] += costs.last_activation_bytes[0]
        assert fig.static_bytes[0, r] == pytest.approx(static, rel=1e-12)
        acts = sum(n * a for n, a in zip(flights[r], per_chunk, strict=True))
        assert fig.activation_bytes[0, r] == pytest.approx(acts, rel=1e-12)
    assert int(np.argmax(fig.memory_bytes[0])) == 0


def _brute_force_s(schedule: str, pp: int, m: int, forward, input_grad, weight) -> float:
    """The step of ``schedule``'s order (torch's, ``rank_steps``) over per-chunk times indexed
    by the chunk's place in the model: every rank runs its operations in order, each when its
    input is ready (the forward of the chunk before, the input gradient of the chunk after, or
    the chunk's own forward on the last; a weight gradient after its input gradient)."""
    stages = 2 * pp
    ops = [[op for step in steps for op in step] for steps in rank_steps(schedule, pp, 2, m)]
    done: dict[tuple[str, int, int], float] = {}
    free, pos = [0.0] * pp, [0] * pp
    duration = {"F": forward, "I": input_grad, "W": weight}
    while any(pos[r] < len(ops[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            while pos[r] < len(ops[r]):
                phase, s, b = ops[r][pos[r]]
                if phase == "F":
                    need = ("F", s - 1, b) if s > 0 else None
                elif phase == "W":
                    need = ("I", s, b)
                else:
                    need = ("F", s, b) if s == stages - 1 else ("I", s + 1, b)
                if need is not None and need not in done:
                    break
                start = max(free[r], done[need] if need else 0.0)
                free[r] = done[(phase, s, b)] = start + duration[phase][s]
                pos[r] += 1
                moved = True
        assert moved, "deadlock"
    return max(free)


@pytest.mark.parametrize("m", [4, 6])
def test_v_simulation_runs_each_chunk_on_its_v_rank(m):
    """The simulated step of an uneven V plan is torch's ZB-V order run with each chunk's own
    times (read from the loop-placed figures of the same split, where the chunk sits on
    another rank), by a brute-force list scheduler; the loop placement's pairs give another
    step."""
    layers = (2, 1, 3, 2)
    problem = small_problem(19)
    options = dataclasses.replace(
        problem.options, framework="torchtitan", pipeline_schedules=("zb-v",)
    )
    training = dataclasses.replace(problem.training, global_batch_sequences=2 * m)  # dp 2
    problem = dataclasses.replace(problem, options=options, training=training)
    model = dataclasses.replace(problem.model, num_layers=sum(layers))
    problem = dataclasses.replace(problem, model=model)
    layout = api.layout_of(problem, tp=1, pp=2, vpp=2, zero=3, pipeline_schedule="zb-v")
    assert layout.grad_accum == m
    ctx, cm = make_context(problem), load_cost_model(None)
    grid = grid_of([layout])
    costs = probe_stage_costs(cm, ctx, grid)
    v = parse_plan(pp=2, vpp=2, stage_layers=layers, stage_recompute="none", placement="v")
    loop = dataclasses.replace(v, placement="loop")
    fig = stage_figures(v, costs, grid["grad_accum"], schedule=stage_schedule("zb-v"))
    ref = stage_figures(loop, costs, grid["grad_accum"], schedule=stage_schedule("zb-h1"))
    times = []
    for table in (ref.chunk_forward_s, ref.chunk_backward_s, ref.chunk_weight_s):
        by_chunk = [0.0] * 4
        for r in range(2):
            for j, c in enumerate(loop.chunks_of(r)):
                by_chunk[c] = float(table[0, r, j])
        times.append(by_chunk)
    forward, backward, weight = times
    input_grad = [b - w for b, w in zip(backward, weight, strict=True)]
    assert len(set(forward)) > 2 and all(w > 0 for w in weight)
    expected = _brute_force_s("zb-v", 2, m, forward, input_grad, weight)
    assert simulated_pipeline_s(fig, 0, schedule=stage_schedule("zb-v")) == pytest.approx(
        expected, rel=1e-12
    )
    swapped = dataclasses.replace(fig, chunk_forward_s=ref.chunk_forward_s)
    assert simulated_pipeline_s(swapped, 0, schedule=stage_schedule("zb-v")) != pytest.approx(
        expected, rel=1e-9
    )


def test_torchtitan_writes_a_per_stage_v_plan():
    """A per-stage ZB-V plan is written in model order (torchtitan splits the layers before it
    places them in a V): ``ZBVZeroBubble`` with ``layers_per_stage`` the middle chunks and the
    first and last shorter; uneven middle chunks are refused with torchtitan's rule."""
    from autopar.outputs import emit

    problem = api.make_problem(**{**LLAMA, "model": "llama-3.1-70b"}, framework="torchtitan")
    layout = api.layout_of(
        problem, tp=8, pp=4, vpp=2, zero=3, recompute="selective", pipeline_schedule="zb-v",
        pipeline_plan="per-stage",
    )  # fmt: skip
    plan = parse_plan(
        pp=4, vpp=2, stage_layers="7,11,11,11,11,11,11,7", stage_recompute="selective",
        placement="v",
    )  # fmt: skip
    staged = api.evaluate_problem(problem, layout, plan=plan)
    assert staged.per_stage.stages[0].chunk_layers == (7, 7)
    # a plan given loop-placed is the same split: the schedule places it
    as_loop = api.evaluate_problem(
        problem, layout, plan=dataclasses.replace(plan, placement="loop")
    )
    assert as_loop.per_stage.plan == plan and as_loop.step_time_s == staged.step_time_s
    parallelism = emit.torchtitan_config(staged, problem)["parallelism"]
    assert parallelism["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    split = ("layers_per_stage", "first_stage_less_layers", "last_stage_less_layers")
    assert [parallelism[f"pipeline_parallel_{k}"] for k in split] == [11, 4, 4]
    uneven = parse_plan(
        pp=4, vpp=2, stage_layers="10,10,10,10,10,10,10,10", stage_recompute="selective",
        placement="v",
    )  # fmt: skip
    uneven = dataclasses.replace(uneven, chunk_layers=(10, 9, 11, 10, 10, 10, 10, 10))
    with pytest.raises(InputError, match="pipeline_parallel_layers_per_stage"):
        emit.torchtitan_config(api.evaluate_problem(problem, layout, plan=uneven), problem)


def test_cli_solves_per_stage_zb_v(runner):
    """``--pipeline-plan per-stage --pipeline-schedule zb-v`` answers (exit 0) with a V plan:
    stage 0 holds the embedding and the loss; its JSON names the placement, as the schema
    says."""
    import json

    from autopar.cli import app
    from tests.test_formats_cli import _validator

    argv = [
        "solve", "--model", "llama-70b", "--gpus", "64", "--seq-len", "4096", "--global-batch",
        "64", "--framework", "torchtitan", "--pipeline-plan", "per-stage", "--pipeline-schedule",
        "zb-v", "--time-limit", "60",
    ]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "zb-v" in result.output and "embedding+loss" in result.output
    solved = runner.invoke(app, [*argv, "--format", "json"])
    assert solved.exit_code == 0, solved.output
    data = json.loads(solved.stdout)
    _validator("solve").validate(data)
    assert data["layouts"][0]["pipeline_plan"]["placement"] == "v"


def test_top_1_and_top_5_agree_on_the_zero_bubble_answer():
    """ZB-H1's formula is not the simulated step for uneven stages: the search's eight best
    outer layouts by it are simulated whatever ``--top`` asks (``SEARCH_CLOSURE``), so the
    answer of ``--top 1`` is the first of ``--top 5``."""
    problem = api.make_problem(**LLAMA, framework="torchtitan", pipeline_schedule="zb-h1")
    ctx, cm = make_context(problem), load_cost_model(None)
    one = solve_result(problem, ctx, cm, time_limit_s=60, num_workers=1, top=1)
    five = solve_result(problem, ctx, cm, time_limit_s=60, num_workers=1, top=5)
    assert len(one.layouts) == 1 and len(five.layouts) == 5
    assert one.best.step_time_s == five.best.step_time_s
    assert one.best.layout == five.best.layout
    assert one.best.per_stage.plan == five.best.per_stage.plan
    searched = [e for e in five.layouts if e.per_stage.plan_from == "search"]
    formula_best = min(searched, key=lambda e: e.per_stage.formula_step_time_s)
    assert five.best is not formula_best  # the case the closure is for
