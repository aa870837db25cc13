"""Per-stage plans under torch's loop-style schedules (issue 23): GPipe, Looped BFS and torch's
interleaved 1F1B priced with the uniform plan's schedule code, the fastest schedule chosen, and
a V schedule's broken rule refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar import api
from autopar.api import make_context
from autopar.base.errors import InputError
from autopar.cli import app
from autopar.costs.plugin import load_cost_model
from autopar.costs.schedule import MEGATRON, simulate
from autopar.costs.schedule_slots import in_flight_chunks, schedule_slots
from autopar.costs.stage_costs import probe_stage_costs
from autopar.costs.stage_figures import stage_figures
from autopar.costs.stage_schedules import ONE_F_ONE_B, STAGE_SCHEDULES, stage_schedule
from autopar.costs.terms import grid_of, memory_bytes, step_time_s
from autopar.layout.stages import StageRecompute, even_plan
from tests.test_stages import small_problem

LLAMA = dict(model="llama-70b", gpus=1024, seq_len=8192, global_batch=1024)


@pytest.mark.parametrize(
    ("schedule", "pp", "vpp", "global_batch"),
    [("gpipe", 4, 1, 1024), ("looped-bfs", 4, 5, 1024), ("1f1b", 4, 2, 192)],
)
def test_even_split_is_the_uniform_model(schedule, pp, vpp, global_batch):
    """The even split under each schedule: its first stage holds the uniform model's memory and
    its step is the uniform one less the logits the uniform model charges to every stage, as
    for Megatron's schedule (``tests/test_stages.py``); 192 sequences give torch's 1F1B rounds
    that Megatron's order does not run (grad_accum 6 on pp 4)."""
    problem = api.make_problem(**{**LLAMA, "global_batch": global_batch}, framework="torchtitan")
    layout = api.layout_of(
        problem, tp=8, pp=pp, vpp=vpp, recompute="selective", zero=3, pipeline_schedule=schedule
    )
    ctx, cm = make_context(problem), load_cost_model(None)
    grid = grid_of([layout])
    costs = probe_stage_costs(cm, ctx, grid)
    plan = even_plan(problem.model.num_layers, pp, vpp, StageRecompute("selective"))
    fig = stage_figures(plan, costs, grid["grad_accum"], schedule=stage_schedule(schedule))
    uniform_memory = float(memory_bytes(cm, grid, ctx)[0])
    # the uniform model's peak is the first stage's (its static bytes); holding every
    # micro-batch, GPipe's and Looped BFS's last stage (the output layer) can exceed it
    assert fig.memory_bytes[0, 0] == pytest.approx(uniform_memory, rel=1e-9 if vpp == 1 else 2e-3)
    logits = float(costs.last_time_s[0])
    expected = float(step_time_s(cm, grid, ctx)[0]) - (pp - 1) * logits / vpp
    assert fig.step_time_s[0] == pytest.approx(expected, rel=1e-9)
    # the estimate's in-flight counts are the schedule's own peak, stage by stage
    staged = api.evaluate_problem(problem, layout, plan=plan)
    m = layout.grad_accum
    assert [s.in_flight for s in staged.per_stage.stages] == list(
        in_flight_chunks(schedule, pp, vpp, m)
    )
    if schedule == "1f1b":
        assert m % pp and staged.per_stage.stages[0].in_flight != MEGATRON.in_flight(pp, vpp, m, 0)


@pytest.mark.parametrize(
    ("name", "pp", "vpp", "m"),
    [("gpipe", 4, 1, 3), ("looped-bfs", 3, 2, 4), ("1f1b", 4, 2, 6), ("1f1b", 4, 3, 2)],
)
def test_closed_form_is_the_simulation_for_equal_stages(name, pp, vpp, m):
    """Each schedule's closed form at equal stages is its slots, which the simulation of its own
    order gives (backward twice the forward)."""
    schedule = STAGE_SCHEDULES[name]
    t = 0.9
    a, b = schedule.step_weights(pp, vpp, m)
    formula = float(
        schedule.pipeline_s(np.array([t]), np.array([pp * t]), np.array([m]), pp=pp, vpp=vpp)[0]
    )
    assert formula == pytest.approx(float(a) * t + float(b) * pp * t, rel=1e-12)
    chunk = np.full((pp, vpp), t / vpp)
    simulated = simulate(name, pp, vpp, m, chunk / 3, 2 * chunk / 3, 0.0).step_s
    assert formula == pytest.approx(simulated, rel=1e-9)
    assert schedule.simulate_s(chunk / 3, 2 * chunk / 3, m) == pytest.approx(simulated)
    slots = schedule_slots(name, pp, vpp, m, (1 / 3, 2 / 3, 0.0, 0.0))
    assert formula == pytest.approx(t * (slots[0] / 3 + 2 * slots[1] / 3), rel=1e-12)


def test_megatron_rows_keep_megatron_pricing():
    """Where Megatron runs (pp divides m), 1F1B and the combined 1F1B price as before."""
    for pp, vpp, m in [(4, 1, 3), (4, 2, 8), (2, 5, 6)]:
        assert ONE_F_ONE_B.step_weights(pp, vpp, m) == MEGATRON.step_weights(pp, vpp, m)
        assert ONE_F_ONE_B.in_flight(pp, vpp, m, 1) == MEGATRON.in_flight(pp, vpp, m, 1)
    assert stage_schedule("combined-1f1b") is stage_schedule("1f1b")


def test_any_schedule_returns_the_fastest_by_the_simulation():
    """A torchtitan per-stage solve over every schedule (the V ones too) returns the step of
    the fastest of the solves held to one schedule, and names that schedule."""
    base = small_problem(19)
    training = dataclasses.replace(base.training, global_batch_sequences=1)
    steps = {}
    every_schedule = ("1f1b", "zb-h1", "zb-v", "dualpipe-v", "gpipe", "looped-bfs")
    singles = [("1f1b",), ("zb-h1",), ("zb-v",), ("gpipe",), ("looped-bfs",)]
    for schedules in [every_schedule, *singles]:
        options = dataclasses.replace(
            base.options, framework="torchtitan", pipeline_schedules=schedules
        )
        problem = dataclasses.replace(base, options=options, training=training)
        result = api.solve_problem(problem, pipeline_plan="per-stage", time_limit=20)
        assert result.status == "optimal"
        steps[schedules] = result.best
        if schedules == every_schedule:  # every schedule has a per-stage plan now
            assert not any("did not search" in n for n in result.notes)
    every = steps.pop(every_schedule)
    fastest = min(steps.values(), key=lambda e: e.step_time_s)
    assert every.step_time_s == pytest.approx(fastest.step_time_s, rel=1e-9)
    assert every.layout.pipeline_schedule == fastest.layout.pipeline_schedule
    assert len({e.layout.pipeline_schedule for e in steps.values()}) == len(singles)


def test_a_v_plan_torchtitan_cannot_write_exits_2_with_the_rule(runner):
    """A per-stage V plan with uneven middle chunks: torchtitan's split cannot write it (V or
    loop), so ``--format torchtitan`` refuses it with the rule and its source (four chunks
    per rank: ``tests/test_schedule_cli.py``)."""
    argv = [
        "evaluate", "--model", "llama-3.1-70b", "--gpus", "64", "--framework", "torchtitan",
        "--pp", "4", "--vpp", "2", "--zero", "3", "--pipeline-schedule", "zb-v",
        "--stage-layers", "10,9,11,10,10,10,10,10", "--format", "torchtitan",
    ]  # fmt: skip
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "uneven split [10, 9, 11, 10" in result.output
    assert "pipeline_parallel_layers_per_stage" in result.output
    assert "Traceback" not in result.output


def test_torchtitan_writes_the_schedule_and_the_per_stage_split():
    """The emitted overrides give the plan's split (``layers_per_stage`` with the first and last
    stage shorter, which ``tests/test_emit_consumers.py`` checks against torchtitan's own
    split) under the schedule it was priced with; a split with uneven middle stages or
    per-stage recompute is refused with the rule."""
    from autopar.layout.stages import parse_plan
    from autopar.outputs import emit

    problem = api.make_problem(**{**LLAMA, "model": "llama-3.1-70b"}, framework="torchtitan")
    layout = api.layout_of(
        problem, tp=8, pp=4, zero=3, recompute="selective", pipeline_schedule="gpipe",
        pipeline_plan="per-stage",
    )  # fmt: skip
    plan = parse_plan(pp=4, vpp=1, stage_layers="19,21,21,19", stage_recompute="selective")
    staged = api.evaluate_problem(problem, layout, plan=plan)
    parallelism = emit.torchtitan_config(staged, problem)["parallelism"]
    assert parallelism["pipeline_parallel_schedule"] == "GPipe"
    split = ("layers_per_stage", "first_stage_less_layers", "last_stage_less_layers")
    assert [parallelism[f"pipeline_parallel_{k}"] for k in split] == [21, 2, 2]
    args = emit.torchtitan_args(staged, problem)
    assert args[-1] == "activation_checkpoint:selective"
    for layers, recompute, rule in [
        ("20,19,21,20", "selective", "pipeline_parallel_layers_per_stage"),
        ("19,21,21,19", "selective,none,none,none", "apply_ac"),
        ("19,21,21,19", "full:20", "apply_ac"),
    ]:
        plan = parse_plan(pp=4, vpp=1, stage_layers=layers, stage_recompute=recompute)
        staged = api.evaluate_problem(problem, layout, plan=plan)
        for write in (emit.torchtitan_args, emit.torchtitan_config):
            with pytest.raises(InputError, match=rule):
                write(staged, problem)
    # without a pipeline too: one stage recomputing some of its layers is no torchtitan mode
    flat = api.layout_of(problem, tp=8, zero=3, recompute="full", pipeline_plan="per-stage")
    plan = parse_plan(pp=1, vpp=1, stage_layers="80", stage_recompute="full:20")
    with pytest.raises(InputError, match="apply_ac"):
        emit.torchtitan_args(api.evaluate_problem(problem, flat, plan=plan), problem)
