"""Per-layer-type and MoE cost terms (issue 12): each check could fail if a term ignored the
layer kinds, the expert grid or the dispatcher."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar.api import load_cost_model, make_context, make_problem
from autopar.costs.estimate import estimate
from autopar.costs.terms import grid_of, memory_bytes, step_time_s
from autopar.inputs.loading import load_model
from autopar.layout.plan import GRID_AXES, Layout
from autopar.layout.space import build_space
from cost_models import default_cost_model
from cost_models.activations import LayerActivationMemory
from cost_models.communication import (
    DISPATCHERS,
    EP_OVERLAP_EXPOSED,
    HOST_BOUND_PAIRS,
    EpCommTime,
    TpCommTime,
    best_dispatcher,
)
from cost_models.compute import ExpertComputeTime, critical_stage
from cost_models.flops import model_flop_per_sequence
from cost_models.shapes import first_stage_kind_counts, stage_bounds


def _ctx(model: str, gpus: int, seq_len: int = 4096, gbs: int = 512, **options):
    problem = make_problem(model=model, gpus=gpus, seq_len=seq_len, global_batch=gbs, **options)
    return make_context(problem)


def _grid(**axes):
    return grid_of([Layout(**{"tp": 1, "pp": 1, "dp": 1, **axes})])


def test_nemotron_h_flops_match_the_published_constant() -> None:
    """NVIDIA dgxc-benchmarking: Nemotron-H 56B, 2.816e15 model FLOPs per 8192-token sequence
    (published/README.md, "Formulas the sources give")."""
    flop = model_flop_per_sequence(load_model("nemotron-h-56b"), 8192)
    assert flop == pytest.approx(2.816e15, rel=0.005)


def test_deepseek_stages_differ_and_the_critical_one_is_reported() -> None:
    model = load_model("deepseek-v3")
    first = first_stage_kind_counts(model, np.array([8]))
    assert first["mla/dense"][0] == 3  # first_k_dense_replace layers on the first stage
    assert [end - start for start, end in stage_bounds(61, 8, last_extra_layers=1)] == [
        7,
        8,
        8,
        8,
        8,
        8,
        8,
        6,
    ]
    counts, is_last = critical_stage(model, np.array([1, 8]), 4096)
    assert counts["mla/moe"][0] == 59 and counts["mla/dense"][0] == 3  # 58 + the MTP layer
    assert counts["mla/moe"][1] + counts["mla/dense"][1] <= 8


def test_tp_comm_counts_only_tp_sharded_sublayers() -> None:
    """Nemotron-H layers hold one sublayer each: half the TP collectives of an attention + MLP
    layer of the same width."""
    ctx = _ctx("nemotron-h-56b", 64, seq_len=8192)
    grid = _grid(tp=8, dp=8, sequence_parallel=True)
    hybrid = TpCommTime().evaluate(grid, ctx)[0]
    dense = dataclasses.replace(ctx.model, layer_types=(), mamba_num_heads=0)
    ratio = hybrid / TpCommTime().evaluate(grid, dataclasses.replace(ctx, model=dense))[0]
    assert ratio == pytest.approx(0.5)


def test_expert_tensor_parallelism_costs_communication() -> None:
    """ETP > 1 all-gathers the routed tokens and reduce-scatters them back (Megatron
    ``token_dispatcher.py``), so expert communication is non-zero even with EP 1."""
    ctx = _ctx("qwen3-30b-a3b", 16)
    term = EpCommTime()
    assert term.evaluate(_grid(tp=2, dp=8, etp=1), ctx)[0] == 0.0
    assert term.evaluate(_grid(tp=2, dp=8, etp=2), ctx)[0] > 0.0


def test_ep_across_nodes_is_priced_not_forbidden() -> None:
    ctx = _ctx("qwen3-30b-a3b", 16)
    rules = build_space(make_problem(model="qwen3-30b-a3b", gpus=16, global_batch=512)).rules
    assert not any("NVLink" in rule.family and "ep" in rule.axes for rule in rules)
    term = EpCommTime()
    inside = term.evaluate(_grid(dp=16, ep=8), ctx)[0]
    across = term.evaluate(_grid(dp=16, ep=16), ctx)[0]
    assert across > inside > 0.0


def test_flex_dispatch_with_node_limited_routing_sends_less_across_nodes() -> None:
    ctx = _ctx("deepseek-v3", 1024)
    grid = _grid(tp=2, pp=8, dp=64, ep=64)
    alltoall = EpCommTime(dispatcher="alltoall").evaluate(grid, ctx)[0]
    flex = EpCommTime(dispatcher="flex").evaluate(grid, ctx)[0]
    ungrouped = dataclasses.replace(ctx.model, moe_router_group_topk=0)
    flex_any_node = EpCommTime(dispatcher="flex").evaluate(
        grid, dataclasses.replace(ctx, model=ungrouped)
    )[0]
    assert flex < flex_any_node < alltoall


def test_overlap_switches_hide_expert_communication() -> None:
    """The shared expert hides behind the dispatch; a paired step of Megatron's combined 1F1B
    hides all but ``EP_OVERLAP_EXPOSED`` of both all-to-alls (its forward's and backward's):
    with no pipeline (combined_1f1b_schedule_for_no_pipelining) ``m - 1`` of ``m`` forwards
    and backwards run paired. Only with CUDA graphs: without them the host cannot feed the
    paired layers and they hide nothing (``HOST_BOUND_PAIRS``)."""
    ctx = _ctx("deepseek-v3", 1024, cuda_graphs="layers")
    grid = _grid(tp=2, pp=8, dp=64, ep=64)
    plain = EpCommTime().evaluate(grid, ctx)[0]
    assert EpCommTime(shared_expert_overlap=True).evaluate(grid, ctx)[0] < plain
    paired = _grid(tp=2, pp=8, dp=64, ep=64, vpp=2, pipeline_schedule="combined-1f1b")
    phases = EpCommTime().phases(paired, ctx)
    whole = phases.forward[0] + phases.backward_input[0]
    assert phases.paired_hidden[0] == pytest.approx((1 - EP_OVERLAP_EXPOSED) * whole)
    assert EpCommTime(ep_overlap=False).phases(paired, ctx).paired_hidden[0] == 0.0
    host_bound = _ctx("deepseek-v3", 1024, cuda_graphs=HOST_BOUND_PAIRS)
    assert EpCommTime().phases(paired, host_bound).paired_hidden[0] == 0.0
    assert EpCommTime().phases(paired, host_bound).forward[0] == pytest.approx(phases.forward[0])
    # torchtitan's DualPipeV runs a pair's halves one after the other (OVERLAP_F_B, torch
    # schedules.py L2889-2894): its pairs hide nothing, nor does 1F1B
    for name in ("dualpipe-v", "1f1b"):
        other = _grid(tp=2, pp=8, dp=64, ep=64, vpp=2, pipeline_schedule=name)
        assert EpCommTime().phases(other, ctx).paired_hidden[0] == 0.0
    m = 8
    layouts = [
        Layout(tp=2, pp=1, dp=512, ep=64, grad_accum=m, pipeline_schedule=name)
        for name in ("1f1b", "combined-1f1b")
    ]
    one, combined = (estimate(layout, ctx, default_cost_model()) for layout in layouts)
    hidden = EpCommTime().phases(grid_of(layouts[1:]), ctx).paired_hidden[0]
    saved = one.time_s["ep_comm"] - combined.time_s["ep_comm"]
    assert saved == pytest.approx((m - 1) * hidden, rel=1e-9)
    assert one.step_time_s - combined.step_time_s == pytest.approx(saved, rel=1e-9)
    assert combined.time_s["bubble"] == pytest.approx(one.time_s["bubble"], abs=1e-9)
    # without graphs the combined schedule saves nothing over 1F1B (HOST_BOUND_PAIRS)
    host_bound = _ctx("deepseek-v3", 1024, cuda_graphs=HOST_BOUND_PAIRS)
    one, combined = (estimate(layout, host_bound, default_cost_model()) for layout in layouts)
    assert combined.time_s["ep_comm"] == pytest.approx(one.time_s["ep_comm"], rel=1e-9)


def test_hybridep_permute_is_hidden_only_with_a_static_budget() -> None:
    """Under EP overlap HybridEP's in-kernel permutation comes off the compute stream only when
    the dispatch need not sync with the host (full-iteration graphs), and only for ``flex``;
    the all-to-all's own term is untouched (and never negative)."""
    grid = _grid(pp=1, dp=8, ep=8, mbs=4)

    def terms(graphs: str, dispatcher: str) -> tuple[float, float]:
        ctx = _ctx("qwen3-30b-a3b", 8, ep_comm_overlap=True, cuda_graphs=graphs)
        expert = ExpertComputeTime(dispatcher=dispatcher).evaluate(grid, ctx)[0]
        return expert, EpCommTime(dispatcher=dispatcher).evaluate(grid, ctx)[0]

    full, layers = terms("full", "flex"), terms("layers", "flex")
    assert full[0] < layers[0] and full[1] == pytest.approx(layers[1]) and full[1] > 0.0
    assert terms("full", "alltoall")[0] == pytest.approx(terms("layers", "alltoall")[0])


def test_capacity_factor_caps_the_load_imbalance() -> None:
    ctx = _ctx("qwen3-30b-a3b", 16)
    grid = _grid(dp=16, ep=16)
    balanced = ExpertComputeTime().evaluate(grid, ctx)[0]
    skewed = ExpertComputeTime(load_imbalance=1.3).evaluate(grid, ctx)[0]
    capped = ExpertComputeTime(load_imbalance=1.3, capacity_factor=1.0).evaluate(grid, ctx)[0]
    assert skewed > balanced and capped == pytest.approx(balanced)


def test_mla_selective_recompute_keeps_only_the_latents() -> None:
    """Q, K, V of 128 heads are re-made from the latents: the first stage (3 dense MLA layers,
    4 MoE) keeps under 60% of its activations."""
    ctx = _ctx("deepseek-v3", 1024)
    term = LayerActivationMemory()
    none = term.evaluate(_grid(tp=2, pp=8, dp=64, sequence_parallel=True), ctx)[0]
    selective = term.evaluate(
        _grid(tp=2, pp=8, dp=64, sequence_parallel=True, recompute="selective"), ctx
    )[0]
    assert selective < 0.6 * none


def test_qwen3_30b_on_256_h100s_picks_expert_parallelism() -> None:
    """The whole space, scored in numpy (what the solver optimises): the fastest layout that
    fits uses EP > 1."""
    problem = make_problem(model="qwen3-30b-a3b", gpus=256, seq_len=4096, global_batch=1024)
    ctx, cost_model = make_context(problem), load_cost_model(None)
    grid = build_space(problem).pruned_grid(GRID_AXES)
    times = step_time_s(cost_model, grid, ctx)
    fits = memory_bytes(cost_model, grid, ctx) <= ctx.cluster.usable_memory_bytes
    best = int(np.argmin(np.where(fits, times, np.inf)))
    assert grid["ep"][best] > 1


def test_default_cost_model_switches_reach_the_terms() -> None:
    cm = default_cost_model(moe_dispatcher="flex", moe_capacity_factor=1.0)
    ep = next(t for t in cm.microbatch_terms if t.name == "ep_comm_s")
    expert = next(t for t in cm.microbatch_terms if t.name == "expert_compute_s")
    assert ep.dispatcher == "flex" and expert.capacity_factor == 1.0


def test_best_dispatcher_is_the_fastest_per_layout() -> None:
    ctx = _ctx("deepseek-v3", 1024)
    grid = grid_of(
        [
            Layout(tp=2, pp=8, dp=64, ep=64),  # EP over 8 nodes: DeepEP's dedup pays
            Layout(tp=2, pp=8, dp=64, ep=1, etp=2),  # no EP: all-gather over 2 ranks
        ]
    )
    best = EpCommTime(dispatcher="best").evaluate(grid, ctx)
    for name in DISPATCHERS:
        assert (best <= EpCommTime(dispatcher=name).evaluate(grid, ctx) + 1e-12).all()
    assert best_dispatcher(grid, ctx)[0] == "flex"


def test_activation_memory_peaks_on_the_stage_with_the_most_in_flight_bytes() -> None:
    """DeepSeek-V3 at PP 8: stage 0 holds 8 micro-batches of 3 dense + 4 MoE layers, stage 1
    holds 7 of 8 MoE layers; the MoE activations of stage 1 set the peak, not stage 0's."""
    from cost_models.activations import ExpertActivationMemory
    from cost_models.shapes import peak_in_flight_stage_bytes, stage_kinds

    model = load_model("deepseek-v3")
    pp = np.array([8])
    per_kind = {"mla/dense": 1.0, "mla/moe": 10.0}
    peak = peak_in_flight_stage_bytes(model, pp, lambda kind: per_kind.get(kind, 0.0))[0]
    by_stage = [
        sum(n * per_kind.get(k, 0.0) for k, n in stage_kinds(model, 8, i).items()) * (8 - i) / 8
        for i in range(8)
    ]
    assert peak == pytest.approx(max(by_stage)) and peak > by_stage[0]
    ctx = _ctx("deepseek-v3", 2048, uneven_pipeline=True)
    grid = _grid(tp=2, pp=8, dp=128, ep=64, grad_accum=8)
    at_pp8 = ExpertActivationMemory().evaluate(grid, ctx)[0]
    one_stage = _grid(tp=2, pp=1, dp=1024, ep=64, grad_accum=1)
    at_pp1 = ExpertActivationMemory().evaluate(one_stage, ctx)[0]
    # PP 1: all 58 MoE layers and the MTP layer; PP 8: stage 1's 8 layers x 7/8, not stage 0's 4
    assert first_stage_kind_counts(model, pp)["mla/moe"][0] == 4
    assert at_pp8 / at_pp1 == pytest.approx(8 * 7 / 8 / 59)


def test_the_token_dispatcher_is_chosen_per_layout_and_reaches_the_launch_config() -> None:
    """The stack allows alltoall and allgather by default; EP comm is priced with the faster
    one for each layout, the estimate names it, and the Megatron and Bridge outputs set it."""
    from autopar.api import evaluate_problem, layout_of
    from autopar.outputs.emit import megatron_args
    from autopar.outputs.emit.bridge import bridge_overrides

    both = make_problem(model="mixtral-8x7b", gpus=64, global_batch=256)
    only_a2a = make_problem(
        model="mixtral-8x7b", gpus=64, global_batch=256, moe_dispatchers="alltoall"
    )
    chosen = set()
    for axes in ({"tp": 8, "etp": 8}, {"tp": 1, "ep": 8}):
        free, fixed = (evaluate_problem(p, layout_of(p, **axes)) for p in (both, only_a2a))
        name = free.choices["moe_token_dispatcher"]
        chosen.add(name)
        assert free.time_s["ep_comm"] <= fixed.time_s["ep_comm"] + 1e-12
        assert f"--moe-token-dispatcher-type {name}" in megatron_args(free, both)
        assert bridge_overrides(free, both)["model"]["moe_token_dispatcher_type"] == name
    assert chosen == {"allgather", "alltoall"}  # each wins somewhere
    dense = evaluate_problem(
        make_problem(model="llama-8b", gpus=8), layout_of(make_problem(model="llama-8b", gpus=8))
    )
    assert dense.choices == {}


def _expert_s(model: str, gpu: str, **options) -> float:
    ctx = _ctx(model, 64, gpu=gpu, **options)
    grid = _grid(dp=64, ep=8, mbs=1)
    return float(ExpertComputeTime().evaluate(grid, ctx)[0])


def test_clamped_glu_and_expert_biases_cost_hbm_passes_unless_fused() -> None:
    """GPT-OSS's clamped SwiGLU and biased experts add elementwise passes on Megatron's unfused
    expert path (fused_bias_geglu.py, experts.py ``_apply_bias``): taking the flags off the model
    makes its experts faster; with Transformer Engine's fused grouped MLP on Blackwell MXFP8
    the activation and casts ride the GEMM epilogues (faster again); on Hopper (no CuTe-DSL
    kernel: compute capability 10 only) it only drops the eager bias and clamp passes."""
    gpt_oss = load_model("gpt-oss-120b")
    assert gpt_oss.clamped_glu and gpt_oss.linear_bias
    plain = dataclasses.replace(gpt_oss, clamped_glu=False, linear_bias=False)
    assert _expert_s(plain, "b200") < _expert_s(gpt_oss, "b200")
    mx = {"precision": "fp8", "fp8_recipe": "mxfp8"}
    unfused = _expert_s(gpt_oss, "b200", **mx)
    assert _expert_s(gpt_oss, "b200", moe_fused_mlp=True, **mx) < 0.97 * unfused
    hopper = _expert_s(gpt_oss, "h100", precision="fp8")
    no_bias_pass = _expert_s(gpt_oss, "h100", precision="fp8", moe_fused_mlp=True)
    assert no_bias_pass < hopper  # fused: no eager bias / clamp passes
    assert no_bias_pass == pytest.approx(_expert_s(plain, "h100", precision="fp8"))
