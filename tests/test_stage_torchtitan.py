"""The per-stage search for torchtitan answers only with plans its output can write
(``autopar.layout.stage_rules``: equal middle chunks, one recompute mode on every layer), while
Megatron's per-stage answers keep every plan."""

from __future__ import annotations

import itertools
import json

import pytest

from autopar import api
from autopar.cli import app
from autopar.layout.stage_rules import PLAN_RULES, broken_plan_rule, expressible_plans
from autopar.layout.stages import StagePlan, StageRecompute
from autopar.pipeline import search

# llama-3.1-8b (a torchtitan 0.3 config) on 8 GPUs, four stages, 34.6 GiB usable: without the
# rules the search answers with uneven middle chunks and recompute that differs by stage
CASE = dict(
    model="llama-3.1-8b", gpus=8, pp=4, seq_len=8192, global_batch=16, memory_reserve_gib=45,
    stack="torchtitan-0.3",
)  # fmt: skip
ARGS = [f"--{k.replace('_', '-')}={v}" for k, v in CASE.items()]
ARGS += ["--pipeline-plan=per-stage", "--top=1", "--time-limit=30"]


def _unrestricted_best(framework: str, monkeypatch):
    """The per-stage optimum with the framework's plan rules switched off in the search."""
    with monkeypatch.context() as patch:
        patch.setattr(search, "restricts_plans", lambda framework: False)
        problem = api.make_problem(**CASE, framework=framework)
        result = api.solve_problem(problem, pipeline_plan="per-stage", time_limit=30)
    assert result.status == "optimal"
    return result.best


def _cli(runner, framework: str, fmt: str) -> str:
    out = runner.invoke(app, ["solve", *ARGS, f"--framework={framework}", f"--format={fmt}"])
    assert out.exit_code == 0, out.output
    return out.output


def test_torchtitan_answer_is_a_plan_torchtitan_writes(runner, monkeypatch):
    """Unrestricted, the search's plan breaks a torchtitan rule; with the rules, the answer holds
    them, is no faster by the formula, and ``--format torchtitan`` writes it (exit 0) with its
    split: ``layers_per_stage`` the middle chunks, the first and last shorter by what the plan
    gives them, and its one recompute mode."""
    free = _unrestricted_best("torchtitan", monkeypatch)
    assert broken_plan_rule(free.per_stage.plan, "torchtitan") is not None
    answer = json.loads(_cli(runner, "torchtitan", "json"))
    assert answer["status"] == "optimal"
    best = answer["layouts"][0]
    written = best["pipeline_plan"]
    plan = StagePlan(
        pp=written["pp"], vpp=written["vpp"], chunk_layers=tuple(written["chunk_layers"]),
        recompute=tuple(StageRecompute.parse(t, source="json") for t in written["recompute"]),
    )  # fmt: skip
    assert broken_plan_rule(plan, "torchtitan") is None
    formula = best["pipeline_schedule"]["formula_step_time_s"]
    assert formula >= free.per_stage.formula_step_time_s * (1 - 1e-9)
    words = _cli(runner, "torchtitan", "torchtitan").split()
    value = {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--parallelism.")}
    per_stage = int(value["--parallelism.pipeline_parallel_layers_per_stage"])
    sizes = plan.chunk_layers
    assert per_stage == max(sizes)
    assert (
        int(value["--parallelism.pipeline_parallel_first_stage_less_layers"])
        == per_stage - sizes[0]
    )
    assert (
        int(value["--parallelism.pipeline_parallel_last_stage_less_layers"])
        == per_stage - sizes[-1]
    )
    assert int(value["--parallelism.pipeline_parallel_degree"]) == plan.pp
    assert words[-1] == f"activation_checkpoint:{plan.recompute[0].mode}"


def test_megatron_answer_keeps_every_plan():
    """Megatron's output takes any plan, so its per-stage search is not held to torchtitan's
    rules: on the same problem it answers with the CP-SAT search's plan, here one torchtitan
    could not write (its answers before and after the rules: ``benchmarks/stage_plans.py``)."""
    problem = api.make_problem(**CASE, framework="megatron")
    megatron = api.solve_problem(problem, pipeline_plan="per-stage", time_limit=30)
    assert megatron.status == "optimal"
    assert megatron.best.per_stage.plan_from == "search"
    assert broken_plan_rule(megatron.best.per_stage.plan, "torchtitan") is not None


def _compositions(num_layers: int, chunks: int):
    for cuts in itertools.combinations_with_replacement(range(num_layers + 1), chunks - 1):
        edges = (0, *cuts, num_layers)
        yield tuple(b - a for a, b in itertools.pairwise(edges))


@pytest.mark.parametrize(("num_layers", "pp", "vpp"), [(7, 1, 1), (7, 2, 1), (9, 3, 1), (8, 2, 2)])
def test_expressible_plans_are_exactly_those_the_rules_allow(num_layers, pp, vpp):
    """Enumerated plans hold every torchtitan rule, and every split with one recompute that
    holds them is enumerated (against all compositions of the layers)."""
    modes = ("none", "selective", "full")
    listed = expressible_plans("torchtitan", num_layers, pp, vpp, modes)
    assert len(set(listed)) == len(listed)
    rules = [r for r in PLAN_RULES if r.framework == "torchtitan"]
    for plan in listed:
        assert all(r.check(plan) for r in rules)
    expected = set()
    for sizes in _compositions(num_layers, pp * vpp):
        if any(n == 0 for n in sizes[1:-1]):
            continue
        for rec in [StageRecompute(), StageRecompute("selective"), *[
            StageRecompute("full", k) for k in range(1, num_layers + 1)
        ]]:  # fmt: skip
            plan = StagePlan(pp=pp, vpp=vpp, chunk_layers=sizes, recompute=(rec,) * pp)
            if broken_plan_rule(plan, "torchtitan") is None:
                expected.add(plan)
    # full:k with k above the largest chunk recomputes the same layers as full:max
    assert {(p.chunk_layers, p.recompute[0].mode) for p in listed} == {
        (p.chunk_layers, p.recompute[0].mode) for p in expected
    }
