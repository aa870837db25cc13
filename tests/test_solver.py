"""CP-SAT against a brute-force oracle over the same terms, plus properties (issue 4)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar.api import make_context
from autopar.costs.plugin import load_cost_model
from autopar.inputs.frameworks import FRAMEWORK_SCHEDULES
from autopar.inputs.specs import (
    GIB,
    ClusterSpec,
    GpuSpec,
    ModelSpec,
    Problem,
    SearchOptions,
    TrainingSpec,
)
from autopar.layout.plan import Layout
from autopar.layout.space import build_space
from autopar.search.solver import solve_space
from tests.oracle import oracle_min_s
from tests.toy_cost_model import toy_cost_model

TOLERANCE_S = 2e-5  # integer microseconds per table in CP-SAT vs float in the oracle
MIB = 1024**2


def random_problem(seed: int) -> Problem:
    rng = np.random.default_rng(seed)
    heads = int(rng.choice([4, 8, 16]))
    model = ModelSpec(
        name=f"random-{seed}",
        num_layers=int(rng.choice([2, 4, 6, 8, 12])),
        hidden_size=heads * int(rng.choice([32, 64, 128])),
        num_attention_heads=heads,
        num_kv_heads=int(rng.choice([h for h in (1, 2, 4, heads) if heads % h == 0])),
        ffn_hidden_size=int(rng.choice([512, 1024, 2048])),
        vocab_size=int(rng.choice([1000, 32000])),
    )
    gpus = int(rng.choice([1, 2, 4, 6, 8, 12, 16, 24, 32]))
    gpu = GpuSpec(
        name="test-gpu",
        memory_bytes=int(rng.choice([1, 2, 4, 8, 16, 80]) * GIB),
        peak_bf16_flop_per_s=1e15,
        peak_fp8_flop_per_s=None,
        hbm_bytes_per_s=3e12,
        nvlink_bytes_per_s=4e11,
        nic_bytes_per_s=5e10,
        gpus_per_node=int(rng.choice([4, 8])),
    )
    training = TrainingSpec(
        num_gpus=gpus,
        global_batch_sequences=int(gpus * rng.choice([1, 2, 4]) * rng.choice([1, 3])),
        seq_len=int(rng.choice([512, 1024, 2048])),
    )
    options = SearchOptions(maxima=(("mbs", 4), ("vpp", 3)), zero_stages=(0, 1, 3))
    return Problem(
        model=model,
        cluster=ClusterSpec(gpu=gpu, gpus_per_node=gpu.gpus_per_node),
        training=training,
        options=options,
    )


def assert_valid(problem: Problem, layout: Layout, space=None) -> None:
    """``layout`` keeps the products and every rule of ``problem``'s space (``space``: that
    space, already built)."""
    t = problem.training
    assert layout.tp * layout.pp * layout.cp * layout.dp == t.num_gpus
    assert layout.mbs * layout.dp * layout.grad_accum == t.global_batch_sequences
    space = build_space(problem) if space is None else space
    assert space.broken_rule(layout.grid_row()) is None


def check_against_oracle(
    problem: Problem, cost_model, methods: tuple[str, ...] = ("auto",)
) -> None:
    """Each of ``methods`` against brute force on ``problem``: one space, context and oracle
    for all of them (the oracle does not depend on the method)."""
    ctx = make_context(problem)
    space = build_space(problem)  # one space for the solver and the oracle
    loose, strict = oracle_min_s(space, ctx, cost_model, margins_bytes=(0.0, MIB))
    for method in methods:
        # one CP-SAT worker: the optimum it proves is the oracle's whatever the worker count
        # (test_same_answer_whatever_the_worker_count); two cost a third more CPU on two cores
        result = solve_space(space, ctx, cost_model, top_k=3, num_workers=1, method=method)
        if result.status == "infeasible":
            assert strict == float("inf"), f"{method}: oracle found {strict} s for {problem}"
            continue
        assert result.status == "optimal", method
        best = result.best
        assert loose - TOLERANCE_S <= best.step_time_s <= strict + TOLERANCE_S, (method, problem)
        assert best.fits, method
        for estimate in result.layouts:
            assert_valid(problem, estimate.layout, space)
        times = [e.step_time_s for e in result.layouts]
        assert all(a <= b + TOLERANCE_S for a, b in zip(times, times[1:], strict=False)), method
        assert len({e.layout for e in result.layouts}) == len(result.layouts), method


BOTH = ("enumerate", "cp-sat")
TOY_METHODS = {seed: BOTH if seed % 2 == 0 else ("enumerate",) for seed in range(200)}
"""Both methods against brute force on random problems: scoring (the default search) on 200,
CP-SAT (the fallback when scoring cannot finish) on every other one of them, 100: 40 ms of
CPU each, the same path every time. A seed's methods share its oracle (one test)."""


@pytest.mark.parametrize("seed", TOY_METHODS)
def test_search_matches_brute_force_toy_model(seed: int) -> None:
    check_against_oracle(random_problem(seed), toy_cost_model(), TOY_METHODS[seed])


@pytest.mark.parametrize("seed", range(1000, 1030))
def test_search_matches_brute_force_default_model(seed: int) -> None:
    check_against_oracle(random_problem(seed), load_cost_model(None), BOTH)


def _llama(gpus: int = 64, memory_gib: float | None = None, **options) -> Problem:
    from autopar.api import make_problem

    problem = make_problem(model="llama-70b", gpus=gpus, seq_len=4096, global_batch=256, **options)
    if memory_gib is not None:
        gpu = dataclasses.replace(problem.cluster.gpu, memory_bytes=int(memory_gib * GIB))
        problem = dataclasses.replace(
            problem, cluster=dataclasses.replace(problem.cluster, gpu=gpu)
        )
    return problem


def _solve(problem: Problem, *, top_k: int = 1, **kwargs):
    from autopar.api import solve_problem

    return solve_problem(problem, top=top_k, **kwargs)


def test_more_memory_never_makes_the_optimum_worse() -> None:
    times = [_solve(_llama(memory_gib=m)).best.step_time_s for m in (40, 60, 80, 140)]
    assert all(b <= a + TOLERANCE_S for a, b in zip(times, times[1:], strict=False))


def test_pinning_the_optimum_gives_the_same_optimum() -> None:
    best = _solve(_llama()).best
    for dim in ("tp", "pp", "cp", "mbs"):
        pinned = _solve(_llama(**{dim: getattr(best.layout, dim)})).best
        assert pinned.step_time_s == pytest.approx(best.step_time_s, abs=TOLERANCE_S)


def test_same_answer_whatever_the_worker_count() -> None:
    problem = _llama()
    answers = [
        tuple(e.layout for e in _solve(problem, top_k=4, num_workers=w).layouts) for w in (1, 2, 8)
    ]
    assert answers[0] == answers[1] == answers[2]


def test_infeasible_problem_explains_what_binds() -> None:
    from autopar.api import make_problem

    problem = make_problem(
        model="llama-3.1-405b", gpus=8, gpu="a100-40gb", seq_len=4096, global_batch=8
    )
    result = _solve(problem)
    assert result.status == "infeasible" and not result.layouts
    explanation = result.explanation
    assert "memory" in [f.family for f in explanation.families]
    miss = explanation.nearest_miss
    assert miss.min_memory_bytes > miss.capacity_bytes
    assert any("GPUs" in s for s in explanation.suggestions)


def test_uneven_pipeline_makes_405b_fit_where_even_splits_cannot() -> None:
    """126 layers: with an even split PP can only be 1 or 2 at a power-of-two GPU count, which
    cannot hold 405B in 80 GB; Megatron's uneven splits (the default) allow PP 8 or 16."""
    from autopar.api import make_problem

    uneven = make_problem(model="llama-3.1-405b", gpus=2048, seq_len=8192, global_batch=512)
    best = _solve(uneven).best
    assert best.fits and 126 % best.layout.pp != 0
    even = dataclasses.replace(
        uneven, options=dataclasses.replace(uneven.options, uneven_pipeline=False)
    )
    assert _solve(even).status == "infeasible"


@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "deepspeed"])
def test_framework_rules_hold_in_every_runner_up(framework: str) -> None:
    from autopar.api import make_problem

    problem = make_problem(
        model="llama-8b", gpus=64, seq_len=4096, global_batch=256, framework=framework, zero="any"
    )
    result = _solve(problem, top_k=8)
    for estimate in result.layouts:
        lay = estimate.layout
        assert_valid(problem, lay)
        if framework == "torchtitan":
            assert lay.zero != 1 and problem.model.num_kv_heads % lay.tp == 0
        if framework == "deepspeed":
            assert lay.cp == 1 and lay.vpp == 1 and (lay.pp == 1 or lay.zero <= 1)


def random_moe_problem(seed: int) -> Problem:
    """A small mixture-of-experts problem: EP and ETP are searched too."""
    dense = random_problem(seed)
    rng = np.random.default_rng(seed)
    experts = int(rng.choice([4, 8]))
    model = dataclasses.replace(
        dense.model,
        name=f"random-moe-{seed}",
        num_experts=experts,
        experts_per_token=int(rng.choice([1, 2])),
        moe_ffn_hidden_size=int(rng.choice([256, 512])),
    )
    return dataclasses.replace(dense, model=model)


@pytest.mark.parametrize("seed", range(2000, 2012))
def test_cpsat_matches_brute_force_moe(seed: int) -> None:
    check_against_oracle(random_moe_problem(seed), load_cost_model(None))


def random_schedule_problem(seed: int) -> Problem:
    """A small torchtitan problem with a pipeline (PP pinned to 2, 3 or 4) searching every
    schedule torchtitan ships: the zero-bubble and V schedules are priced by their simulation,
    and the solver's objective for them is a lower bound of it; the answer must still be the
    brute-force minimum of the simulated steps."""
    dense = random_problem(seed)
    rng = np.random.default_rng(seed)
    pp = int(rng.choice([2, 3, 4]))
    framework = "torchtitan"
    options = dataclasses.replace(
        dense.options,
        framework=framework,
        zero_stages=(0, 3),
        pipeline_schedules=tuple(name for name, _ in FRAMEWORK_SCHEDULES[framework]),
        pins=(("pp", pp),),
    )
    model = dataclasses.replace(dense.model, num_layers=int(rng.choice([12, 24])))
    gpus = pp * int(rng.choice([1, 2, 4]))
    training = dataclasses.replace(
        dense.training, num_gpus=gpus, global_batch_sequences=gpus * int(rng.choice([4, 8, 12]))
    )
    return dataclasses.replace(dense, model=model, options=options, training=training)


@pytest.mark.parametrize("seed", [*range(3000, 3010), 3016, 3033])  # 3001, 3016, 3033: bound loose
def test_search_matches_brute_force_with_every_schedule(seed: int) -> None:
    """Scoring's lower bounds closed by simulation (``autopar.search.exact``) and CP-SAT's
    (``autopar.search.prove._exact_best``) both answer the least simulated step."""
    check_against_oracle(random_schedule_problem(seed), load_cost_model(None), BOTH)


@pytest.mark.parametrize("seed", range(2000, 2006))
def test_search_matches_brute_force_moe_with_the_combined_1f1b(seed: int) -> None:
    problem = random_moe_problem(seed)
    options = dataclasses.replace(problem.options, pipeline_schedules=("1f1b", "combined-1f1b"))
    problem = dataclasses.replace(problem, options=options)
    check_against_oracle(problem, load_cost_model(None), BOTH)


def test_ties_are_marked_and_the_preferred_one_has_headroom() -> None:
    """Issue 21: layouts within the cost model's error band of the fastest are ties; with
    --prefer headroom the first one fills at most HEADROOM_FILL of the memory, and it is the
    fastest such tie (Llama-3 70B on 1024 H100s: the fastest fills 98%)."""
    from autopar.api import make_problem
    from autopar.layout.results import HEADROOM_FILL

    problem = make_problem(model="llama-70b", gpus=1024)
    fastest = _solve(problem, top_k=3)
    ties = fastest.ties
    assert ties is not None and ties.count > 1 and ties.fastest_index == 0
    limit = fastest.best.step_time_s * (1 + ties.rel_error)
    assert all(fastest.layouts[i].step_time_s <= limit for i in ties.tied)
    assert len(fastest.layouts) == 3 and ties.preferred_index == 2
    capacity = fastest.best.capacity_bytes
    pick = ties.preferred
    assert fastest.layouts[2].layout == pick.layout
    assert (
        pick.memory_bytes["total"] <= HEADROOM_FILL * capacity < fastest.best.memory_bytes["total"]
    )
    assert pick.step_time_s <= limit
    roomy = _solve(problem, top_k=3, prefer="headroom")
    assert roomy.best.layout == pick.layout and roomy.ties.preferred_index == 0
    assert roomy.layouts[roomy.ties.fastest_index].layout == fastest.best.layout
    assert all(e.step_time_s <= limit for e in roomy.layouts)
    # the fastest and the preferred tie are the estimates of their rows, among the layouts or not
    assert ties.fastest == fastest.best and pick == fastest.layouts[2]
    one = _solve(problem, top_k=1)
    assert len(one.layouts) == 1 and one.ties.preferred == pick
    assert pick.layout.text() in one.ties.text()
