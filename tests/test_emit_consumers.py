"""Every model preset x a set of layouts (dense and MoE, with and without interleaving, uneven
pipelines, ZeRO 0-3, CP) x every launch format: the consumer accepts the output and reads back the
layout autopar planned, or autopar refuses with an InputError naming what the format cannot
express. No third outcome: no traceback, no silent drop. See tests/consumers.py for how each
consumer is checked."""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import pytest

import autopar
from autopar.base.errors import InputError
from autopar.inputs.loading import load_gpu, load_model, load_stack
from autopar.inputs.specs import GpuSpec, ModelSpec
from autopar.inputs.stack import StackSpec
from autopar.layout.plan import Layout
from autopar.layout.split import pipeline_split
from autopar.outputs import emit
from tests import consumers

pytestmark = pytest.mark.xdist_group("torch")  # one worker imports torch (tests/conftest.py)

PRESETS = sorted(p.stem for p in (Path(autopar.__file__).parent / "presets/models").glob("*.yaml"))


def _tp(model: ModelSpec) -> int:
    """Largest TP Megatron's TransformerConfig accepts for the model (heads, query groups, FFN)."""
    sizes = (model.num_attention_heads, model.num_kv_heads, model.ffn_hidden_size)
    return next(t for t in (8, 4, 2, 1) if all(s % t == 0 for s in sizes))


def _interleaving(layers: int) -> tuple[int, int] | None:
    return next(
        ((pp, vpp) for pp in (4, 8, 3) for vpp in (2, 3, 4, 5) if layers % (pp * vpp) == 0), None
    )


def _split_of_kind(layers: int, kind: str) -> tuple[int, int] | None:
    """A (pp, vpp) whose planned split accounts for the embedding, or has first/last-stage
    layer counts with interleaving (``autopar.layout.split.pipeline_split``)."""
    for pp in range(3, 17):
        for vpp in (1, 2, 3, 4) if kind == "account_for_embedding" else (2, 3, 4):
            split = pipeline_split(layers, pp, vpp)
            if split is None:
                continue
            if kind == "account_for_embedding" and split.account_for_embedding:
                return pp, vpp
            if kind == "first" and split.first_stage_layers is not None:
                return pp, vpp
    return None


def layouts(model: ModelSpec) -> dict[str, Layout]:
    tp, sp = _tp(model), _tp(model) > 1
    out = {
        "zero1-selective": Layout(
            tp=tp, pp=1, dp=8, grad_accum=4, zero=1, sequence_parallel=sp, recompute="selective"
        ),
        "zero3-full": Layout(
            tp=tp, pp=1, dp=16, grad_accum=2, zero=3, sequence_parallel=sp, recompute="full"
        ),
        "zero2-pp2": Layout(tp=tp, pp=2, dp=4, mbs=2, grad_accum=4, zero=2, sequence_parallel=sp),
        "zero0-cp2-pp4": Layout(tp=tp, pp=4, dp=2, cp=2, grad_accum=8, sequence_parallel=sp),
        "no-sp-pp4-full": Layout(tp=tp, pp=4, dp=2, grad_accum=8, zero=1, recompute="full"),
        "offload": Layout(tp=tp, pp=1, dp=8, grad_accum=4, zero=1, sequence_parallel=sp),
    }
    if (split := _interleaving(model.num_layers)) is not None:
        pp, vpp = split
        out["interleaved"] = Layout(
            tp=tp, pp=pp, dp=4, vpp=vpp, grad_accum=2 * pp, zero=1, sequence_parallel=sp
        )
    uneven = next(pp for pp in (3, 5, 7, 6) if model.num_layers % pp)
    out["uneven"] = Layout(tp=tp, pp=uneven, dp=2, grad_accum=uneven, sequence_parallel=sp)
    for label, kind in (("accounted", "account_for_embedding"), ("ends-interleaved", "first")):
        found = _split_of_kind(model.num_layers, kind)
        if found is not None:
            pp, vpp = found
            out[label] = Layout(
                tp=tp, pp=pp, dp=2, vpp=vpp, grad_accum=2 * pp, zero=1, sequence_parallel=sp
            )
    if model.is_moe:
        ep = min(8, model.num_experts)
        out["moe-ep"] = Layout(tp=tp, pp=1, dp=8, ep=ep, grad_accum=4, zero=1, sequence_parallel=sp)
        out["moe-ep-etp-fsdp"] = Layout(
            tp=tp, pp=2, dp=8, ep=ep, etp=tp, grad_accum=4, zero=3, sequence_parallel=sp
        )
    return out


STACKS = sorted(p.stem for p in (Path(autopar.__file__).parent / "presets/stacks").glob("*.yaml"))
STACK_LAYOUTS = ("zero1-selective", "interleaved", "zero0-cp2-pp4", "no-sp-pp4-full", "moe-ep")


@functools.lru_cache(maxsize=256)
def _model(name: str) -> ModelSpec:
    """The model ``make_problem(model=name, ...)`` loads (``autopar.inputs.loading.load_model``),
    read once per name: a frozen spec, so sharing it cannot leak state between tests."""
    return load_model(name)


@functools.lru_cache(maxsize=64)
def _stack(name: str | None) -> StackSpec:
    return load_stack(name)  # frozen, as ``_model``


@functools.lru_cache(maxsize=16)
def _gpu(name: str) -> GpuSpec:
    return load_gpu(name)  # frozen, as ``_model``


@functools.lru_cache(maxsize=4096)
def _job_problem(name: str, gpus: int, batch: int, precision: str, stack: str | None, extra):
    """``make_problem`` on the loaded specs, which it takes in place of their names (each
    ``load_*`` returns a spec unchanged): the same, equal ``Problem``, without re-reading the
    presets for each of the ~2,300 cases. Cached because cases repeat (a frozen ``Problem``;
    the checks only read it); 4096 bounds the module's ~2,100 distinct jobs."""
    keywords = dict(extra)
    keywords["gpu"] = _gpu(keywords.get("gpu", "h100"))  # the default GPU (``load_cluster``)
    return autopar.make_problem(
        model=_model(name),
        gpus=gpus,
        seq_len=4096,
        global_batch=batch,
        precision=precision,
        stack=_stack(stack),
        **keywords,
    )


def _problem(name: str, lay: Layout, precision: str, stack: str | None = None, extra=()):
    gpus = lay.tp * lay.pp * lay.dp * lay.cp
    batch = lay.mbs * lay.grad_accum * lay.dp
    return _job_problem(name, gpus, batch, precision, stack, tuple(extra))


BLACKWELL = (("gpu", "b200"),)
BLACKWELL_CASES = {
    "zero1-selective": (
        ("nvfp4", None, BLACKWELL),
        ("fp8", None, (*BLACKWELL, ("fp8_recipe", "mxfp8"))),
        ("bf16", None, (("cuda_graphs", "layers"),)),
        ("bf16", None, (("cuda_graphs", "layers"), ("dropout", False))),
        ("bf16", None, (("recompute_modules", "layernorm,moe_act"),)),
    ),
    "offload": (
        ("bf16", None, (("cpu_offload_layers", 2),)),
        ("bf16", None, (("cpu_offload_layers", 2), ("cuda_graphs", "full"))),
        ("nvfp4", None, (*BLACKWELL, ("cuda_graphs", "full"))),
    ),
    "no-sp-pp4-full": (("bf16", None, (("cuda_graphs", "layers"),)),),
}
"""NVFP4, MXFP8, CUDA graphs and CPU offloading (issue 20) on the layouts that take them, and
per-layer graphs with full recomputation (Megatron refuses the pair)."""


def _cases(label: str):
    """(precision, stack, extra keywords) tried for a layout: every stack preset on a few
    layouts, the Blackwell recipes on others."""
    yield "bf16", None, ()
    if label in STACK_LAYOUTS:
        yield from (("bf16", stack, ()) for stack in STACKS)
    if label == "zero1-selective":
        yield from (("fp8", None, ()), ("fp8", "nemo-24.07", ()))
    yield from BLACKWELL_CASES.get(label, ())


def _megatron(lay: Layout, problem) -> None:
    args = consumers.megatron_parse(emit.megatron_args(lay, problem))
    config = consumers.megatron_transformer_config(args)
    model = problem.model
    assert config.num_layers == model.num_layers and config.hidden_size == model.hidden_size
    assert config.num_query_groups == model.num_kv_heads
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (
        lay.tp,
        lay.pp,
    )
    assert (config.virtual_pipeline_model_parallel_size or 1) == lay.vpp
    assert (
        config.context_parallel_size == lay.cp and config.sequence_parallel == lay.sequence_parallel
    )
    assert (config.num_moe_experts or 0) == model.num_experts
    if model.is_moe:
        assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == (
            lay.ep,
            lay.etp,
        )
        assert config.moe_token_dispatcher_type == "alltoall"
    if lay.pp > 1 and config.num_layers_in_first_pipeline_stage is not None:
        middle = (
            model.num_layers
            - config.num_layers_in_first_pipeline_stage
            - config.num_layers_in_last_pipeline_stage
        )
        assert middle % (lay.pp - 2 or 1) == 0
    assert config.recompute_granularity == (None if lay.recompute == "none" else lay.recompute)
    if lay.recompute == "selective":
        expected = emit.common.selective_modules(model, problem.training.stack) or ["core_attn"]
        assert config.recompute_modules == expected
    stack = problem.training.stack
    mxfp8 = stack.fp8_recipe == "mxfp8"
    assert config.fp8 == {"fp8": "e4m3" if mxfp8 else "hybrid"}.get(problem.training.precision)
    assert config.fp4 == {"nvfp4": "e2m1"}.get(problem.training.precision)
    assert config.cpu_offloading_num_layers == stack.cpu_offload_layers
    assert config.tp_comm_overlap == (stack.tp_comm_overlap and lay.tp > 1)
    assert config.hidden_dropout == config.attention_dropout == (0.1 if stack.dropout else 0.0)
    assert config.cross_entropy_loss_fusion == stack.cross_entropy_fusion
    if stack.cross_entropy_fusion:
        assert config.cross_entropy_fusion_impl == stack.cross_entropy_impl
    assert config.cp_comm_type == (stack.cp_comm_type if lay.cp > 1 else None)
    impl = {"none": None, "layers": ["transformer_engine"], "full": ["full_iteration"]}
    assert args.get("--cuda-graph-impl") == impl[stack.cuda_graphs]
    zero = ("--use-megatron-fsdp" in args, "--use-distributed-optimizer" in args)
    assert zero == {0: (False, False), 1: (False, True), 2: (True, True), 3: (True, True)}[lay.zero]
    if lay.zero >= 2:
        expected = "optim_grads" if lay.zero == 2 else "optim_grads_params"
        assert args["--data-parallel-sharding-strategy"] == [expected]


def _bridge(lay: Layout, problem) -> None:
    overrides = emit.bridge_overrides(lay, problem)
    consumers.bridge_check(overrides)
    assert overrides["model"]["virtual_pipeline_model_parallel_size"] == (
        lay.vpp if lay.vpp > 1 else None
    )
    assert overrides["ddp"].get("use_megatron_fsdp", False) == (lay.zero >= 2)


def _stages_match(lay: Layout, problem, parallelism: dict) -> None:
    if lay.pp == 1:
        return
    per_stage = consumers.torchtitan_stage_layers(problem.model.num_layers, parallelism)
    assert len(per_stage) == lay.pp * lay.vpp
    assert sum(per_stage) == problem.model.num_layers
    model = problem.model
    planned = emit.common.virtual_stage_layers(
        model.num_layers, lay.pp, lay.vpp, mtp_layers=model.num_mtp_layers
    )
    assert per_stage == planned


def _torchtitan(lay: Layout, problem) -> None:
    from torchtitan.config.configs import ParallelismConfig, TrainingConfig

    args = emit.torchtitan_args(lay, problem)
    assert args[-1] == f"activation_checkpoint:{lay.recompute}"
    pairs = dict(zip(args[4:-1:2], args[5:-1:2], strict=False))
    parallelism, training = {}, {}
    for key, value in pairs.items():
        if not key.startswith("--") or value.startswith("--"):
            continue
        section, field = key[2:].split(".")
        target = parallelism if section == "parallelism" else training
        target[field] = int(value) if value.isdigit() else value
    ParallelismConfig(**parallelism)  # unknown field or failing __post_init__ raises
    TrainingConfig(**training)
    assert parallelism["tensor_parallel_degree"] == lay.tp
    assert parallelism["expert_parallel_degree"] == lay.ep
    assert (
        parallelism["data_parallel_shard_degree"] * parallelism["data_parallel_replicate_degree"]
        == lay.dp
    )
    assert ("--training.disable-cuda-graphs" in args) == (lay.pp > 1 or lay.ep > 1)
    _stages_match(lay, problem, parallelism)
    mesh = {k: v for k, v in parallelism.items() if k.endswith("_degree")}
    consumers.torchtitan_mesh(mesh, lay.num_gpus)  # torchtitan builds the device mesh


def _torchtitan_02(lay: Layout, problem) -> None:
    fields = consumers.vendored("torchtitan-0.2.2-job-config.json")["sections"]
    config = emit.torchtitan_config(lay, problem)
    for section, values in config.items():
        assert set(values) <= set(fields[section]), (section, set(values) - set(fields[section]))
    parallelism = {
        k: v for k, v in config["parallelism"].items() if k != "expert_tensor_parallel_degree"
    }
    _stages_match(lay, problem, parallelism)
    if problem.model.is_moe:
        assert config["parallelism"]["expert_tensor_parallel_degree"] == lay.etp


def _deepspeed(lay: Layout, problem) -> None:
    config = consumers.deepspeed_config(emit.deepspeed_json(lay, problem), lay.dp)
    assert config.train_batch_size == problem.training.global_batch_sequences
    assert config.zero_optimization_stage == lay.zero
    assert config.pipeline["stages"] == "auto"  # DeepSpeed's default: the size is in code
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[problem.training.grad_precision]
    assert config.communication_data_type == dtype
    notes = emit.deepspeed_notes(lay, problem)
    assert f"TP {lay.tp} x PP {lay.pp} x DP {lay.dp}" in notes[0]
    topology = [n for n in notes if "PipeModelDataParallelTopology(" in n]
    assert bool(topology) == (lay.pp > 1)
    if topology:  # DeepSpeed's own topology class, built from the note's numbers
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        sizes = dict(re.findall(r"(num_pp|num_mp|num_dp)=(\d+)", topology[0]))
        topo = PipeModelDataParallelTopology(**{k: int(v) for k, v in sizes.items()})
        assert (topo.get_dim("pipe"), topo.get_dim("model"), topo.get_dim("data")) == (
            lay.pp,
            lay.tp,
            lay.dp,
        )


CHECKS = {
    "megatron": _megatron,
    "megatron-bridge": _bridge,
    "torchtitan": _torchtitan,
    "torchtitan-0.2": _torchtitan_02,
    "deepspeed": _deepspeed,
}


def test_every_format_is_checked():
    assert set(CHECKS) == set(emit.EMITTERS)


def _mla_yarn_unflagged(model) -> bool:
    """MLA YaRN whose beta_fast / beta_slow / original length differ from
    MLATransformerConfig's defaults: Megatron-LM has no flag for them (Kimi-K2's beta_fast 1)."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    if not (model.is_mla and model.rope.scaling == "yarn"):
        return False
    defaults = {f.name: f.default for f in dataclasses.fields(MLATransformerConfig)}
    rope = model.rope
    ours = (rope.beta_fast, rope.beta_slow, rope.original_max_position_embeddings)
    theirs = tuple(
        defaults[k] for k in ("beta_fast", "beta_slow", "original_max_position_embeddings")
    )
    return ours != theirs


def _expert_mesh_ok(lay: Layout, *, etp: int) -> bool:
    """torchtitan's expert mesh: efsdp = dp_shard*cp*tp // (etp*ep) must cover the world
    (0.2.2 distributed/parallel_dims.py:138; 0.3 is checked by building its mesh)."""
    shard = lay.dp if lay.zero >= 2 else 1
    return lay.ep == 1 or (shard * lay.cp * lay.tp) % (etp * lay.ep) == 0


def _expected_refusal(fmt: str, lay: Layout, problem) -> bool:
    stack = problem.training.stack
    if _blackwell_refusal(fmt, lay, problem):
        return True
    fp8 = problem.training.precision == "fp8"
    bf16_grads = problem.training.grad_precision == "bf16"
    tp_overlap_without_sp = stack.tp_comm_overlap and lay.tp > 1 and not lay.sequence_parallel
    model = problem.model
    unwritten = bool(emit.common.unsupported_layers(model))  # sliding, Mamba, sinks
    biased_etp = model.is_moe and model.linear_bias and lay.etp > 1
    if fmt == "megatron":
        return tp_overlap_without_sp or unwritten or biased_etp or _mla_yarn_unflagged(model)
    if fmt == "megatron-bridge":
        return bf16_grads or tp_overlap_without_sp or unwritten or biased_etp
    if fmt.startswith("torchtitan") and bf16_grads:
        return True
    if fmt == "deepspeed":
        return bool(
            lay.vpp > 1
            or lay.ep > 1
            or lay.etp > 1
            or lay.cp > 1
            or fp8
            or (lay.sequence_parallel and lay.tp > 1)
            or (lay.pp > 1 and lay.zero >= 2)
        )
    if fmt == "torchtitan-0.2":
        return bool(
            not _expert_mesh_ok(lay, etp=lay.etp)
            or lay.zero == 1
            or (lay.etp > 1 and lay.etp != lay.tp)
            or (lay.tp > 1 and not lay.sequence_parallel)
        )
    if fmt == "torchtitan":
        known = emit.torchtitan.torchtitan_model(problem.model)
        ep_ok = _expert_mesh_ok(lay, etp=1)
        unknown = known is None or bool(known.refuse_03)
        return unknown or fp8 or lay.zero == 1 or lay.etp > 1 or not ep_ok
    return False


def _blackwell_refusal(fmt: str, lay: Layout, problem) -> bool:
    """NVFP4 and CPU offloading exist in Megatron(-Bridge) only; Megatron refuses per-layer
    graphs with full recompute and offloading with pp > 1 or recompute; megatron-core 0.16 (the
    Bridge target) any graph with offloading."""
    stack = problem.training.stack
    megatron = fmt in ("megatron", "megatron-bridge")
    if not megatron and (problem.training.precision == "nvfp4" or stack.cpu_offload_layers):
        return True
    if megatron and stack.cuda_graphs == "layers" and lay.recompute == "full":
        return True
    if megatron and stack.cuda_graphs != "none" and stack.dropout and lay.recompute == "selective":
        return True
    if megatron and stack.cpu_offload_layers and (lay.pp > 1 or lay.recompute != "none"):
        return True
    graphed_offload = bool(stack.cpu_offload_layers) and stack.cuda_graphs != "none"
    return fmt == "megatron-bridge" and graphed_offload


@pytest.mark.parametrize("name", PRESETS)
def test_presets_accepted_or_refused(name):
    """Each preset x layout x format: accepted by the consumer or refused as expected."""
    model = _model(name)
    outcomes = {}
    for label, lay in layouts(model).items():
        for precision, stack, extra in _cases(label):
            problem = _problem(name, lay, precision, stack, extra)
            for fmt, check in CHECKS.items():
                try:
                    check(lay, problem)
                    outcome = "accepted"
                except InputError as error:
                    assert "cannot express" in str(error) and "--format" in str(error), error
                    outcome = "refused"
                expected = "refused" if _expected_refusal(fmt, lay, problem) else "accepted"
                outcomes[fmt, label, precision, stack, extra] = outcome
                assert outcome == expected, (fmt, label, precision, stack, extra)
    default = [outcomes["megatron", label, "bf16", None, ()] for label in layouts(model)]
    if not emit.common.unsupported_layers(model) and not _mla_yarn_unflagged(model):
        assert default.count("accepted") >= len(default) - 1  # at most the biased-ETP layout


def test_readme_main_job_in_every_format():
    """The README's main job, solved, then emitted in every format (refusals allowed)."""
    result = autopar.solve(model="llama-70b", gpus=1024, top=1, time_limit=20)
    problem = autopar.make_problem(model="llama-70b", gpus=1024)
    best = result.best.layout
    for fmt, check in CHECKS.items():
        try:
            check(best, problem)
        except InputError as error:
            assert _expected_refusal(fmt, best, problem), (fmt, error)


def test_torchtitan_config_manager_reads_interleaved_70b():
    """torchtitan 0.3's own parser on the emitted command line, interleaved PP."""
    problem = autopar.make_problem(model="llama-3.1-70b", gpus=256, seq_len=8192, global_batch=64)
    lay = Layout(
        tp=8, pp=4, dp=8, vpp=5, grad_accum=8, zero=3, sequence_parallel=True, recompute="selective"
    )
    config = consumers.torchtitan_parse(emit.torchtitan_args(lay, problem))
    par = config.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (8, 4)
    assert (
        par.data_parallel_shard_degree == 8 and par.pipeline_parallel_schedule == "Interleaved1F1B"
    )
    assert (
        par.pipeline_parallel_first_stage_less_layers,
        par.pipeline_parallel_last_stage_less_layers,
    ) == (0, 0)
    assert config.training.local_batch_size == 8 and config.training.global_batch_size == 64
    assert config.training.disable_cuda_graphs
    assert type(config.activation_checkpoint).__qualname__ == "SelectiveAC.Config"
    assert len(config.model_spec.model.layers) == problem.model.num_layers  # the same model


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "looped-bfs", "zb-h1", "zb-v", "dualpipe-v"])
def test_torchtitan_runs_each_schedule_it_ships(schedule):
    """torchtitan 0.3's parser takes the schedule's name, torch's ``get_schedule_class`` knows
    it, and torchtitan's own split gives each rank the chunks autopar planned (one for the
    single-stage schedules, two for the V ones, ``pipeline_parallel.py`` L204-264)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    problem = autopar.make_problem(
        model="llama-3.1-70b", gpus=256, seq_len=8192, global_batch=64, framework="torchtitan"
    )
    vpp = 1 if schedule in ("gpipe", "1f1b") else 2
    lay = Layout(
        tp=8, pp=4, dp=8, vpp=vpp, grad_accum=8, zero=3, sequence_parallel=True,
        pipeline_schedule=schedule,
    )  # fmt: skip
    config = consumers.torchtitan_parse(emit.torchtitan_args(lay, problem))
    par = config.parallelism
    cls = get_schedule_class(par.pipeline_parallel_schedule)
    assert issubclass(cls, PipelineScheduleSingle) == (vpp == 1)
    layers = consumers.torchtitan_stage_layers(
        problem.model.num_layers, emit.torchtitan_config(lay, problem)["parallelism"]
    )
    assert len(layers) == 4 * vpp and sum(layers) == problem.model.num_layers


def test_megatron_and_bridge_take_the_combined_1f1b():
    """Megatron's combined 1F1B: its two flags (and the Bridge's two CommOverlapConfig fields)
    are ones the consumers have; torchtitan and DeepSpeed refuse it."""
    problem = autopar.make_problem(model="qwen3-30b-a3b", gpus=64, seq_len=4096, global_batch=128)
    lay = Layout(tp=1, pp=2, vpp=2, dp=32, ep=8, grad_accum=4, pipeline_schedule="combined-1f1b")
    args = consumers.megatron_parse(emit.megatron_args(lay, problem))
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    overrides = emit.bridge_overrides(lay, problem)
    consumers.bridge_check(overrides)
    assert overrides["comm_overlap"]["overlap_moe_expert_parallel_comm"] is True
    # Llama-3.1: torchtitan's llama3_8b config is Llama-3.1's (RoPE scaled x8); Llama-3 8B is
    # refused for that before the schedule is looked at
    dense = autopar.make_problem(model="llama-3.1-8b", gpus=64, seq_len=4096, global_batch=128)
    plain = Layout(tp=1, pp=2, dp=32, grad_accum=4, pipeline_schedule="combined-1f1b")
    for refused in (emit.torchtitan_args, emit.deepspeed_json):
        with pytest.raises(InputError, match="combined-1f1b pipeline schedule"):
            refused(plain, dense)


def test_torchtitan_config_manager_reads_qwen3_moe_with_ep():
    """torchtitan 0.3's own parser, an MoE model with EP over FSDP ranks (CUDA graphs off)."""
    problem = autopar.make_problem(model="qwen3-30b-a3b", gpus=64, seq_len=4096, global_batch=128)
    lay = Layout(tp=2, pp=1, dp=32, ep=8, mbs=4, grad_accum=1, zero=3, recompute="full")
    config = consumers.torchtitan_parse(emit.torchtitan_args(lay, problem))
    assert config.parallelism.expert_parallel_degree == 8
    assert config.parallelism.data_parallel_shard_degree == 32
    assert not config.parallelism.enable_sequence_parallel  # TP without SP, as planned
    assert config.training.disable_cuda_graphs and config.training.local_batch_size == 4
    assert type(config.activation_checkpoint).__qualname__ == "FullAC.Config"
    assert len(config.model_spec.model.layers) == 48


# torchtitan 0.3's text-decoder modules and their flavor tables (models/<module>/__init__.py)
TORCHTITAN_REGISTRIES = {
    "llama3": "llama3_configs",
    "qwen3": "qwen3_configs",
    "deepseek_v3": "deepseekv3_configs",
    "gpt_oss": "gptoss_configs",
    "kimi_k2_7": "kimi_k2_5_configs",
}


def _config_function(known: emit.torchtitan.TorchtitanModel):
    """The config_registry function's source and first line, read from its file (importing
    kimi_k2_7's config_registry needs torchvision, which the CPU torch cannot load beside)."""
    import torchtitan

    path = Path(torchtitan.__file__).parent / known.source.split(":")[0]
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {known.config}("))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("def ")), len(lines))
    return "\n".join(lines[start:end]), start + 1


@pytest.mark.parametrize("known", emit.torchtitan.TORCHTITAN_MODELS, ids=lambda k: k.config)
def test_torchtitan_table_is_torchtitans_own(known):
    """Each entry: the cited config function exists at that line, and the model it builds has
    the architecture the entry claims; a refused one uses what the refusal says."""
    import importlib

    source, line = _config_function(known)
    assert known.source == f"models/{known.module}/config_registry.py:{line}"
    flavor = re.search(r'model_registry\(\s*"([^"]+)"', source).group(1)
    registry = importlib.import_module(f"torchtitan.models.{known.module}")
    built = consumers.torchtitan_architecture(registry.model_registry(flavor).model)
    assert tuple(built.values()) == known.arch, built
    assert list(built) == list(emit.torchtitan.ARCH_FIELDS)
    if known.config == "llama3_405b":
        assert "Float8LinearConverter" in source and "FP8" in known.refuse_03
    if known.config == "kimi_k2_5":
        assert "_dist_muon_optimizer" in source and "Muon" in known.refuse_03


def test_torchtitan_covers_every_flavor_of_a_preset():
    """Every flavor torchtitan 0.3 ships whose architecture is an autopar preset's is in the
    table, or has no config function to name it by (then the refusal says so)."""
    import importlib

    presets = {}
    for name in PRESETS:
        model = _model(name)
        presets.setdefault(emit.torchtitan.architecture(model), name)
    table = {k.arch: k for k in emit.torchtitan.TORCHTITAN_MODELS}
    matched = {}
    for module, flavors in TORCHTITAN_REGISTRIES.items():
        registry = importlib.import_module(f"torchtitan.models.{module}")
        for flavor in getattr(registry, flavors):
            if "debug" in flavor:
                continue
            arch = tuple(
                consumers.torchtitan_architecture(registry.model_registry(flavor).model).values()
            )
            if arch in presets:
                matched[module, flavor] = presets[arch]
                if arch not in table:  # qwen3 235B-A22B: a flavor, no config function
                    path = Path(registry.__file__).parent / "config_registry.py"
                    assert f'"{flavor}"' not in path.read_text(encoding="utf-8"), flavor
    # The RoPE tells apart what the shapes did not: torchtitan's llama3 flavors are Llama-3.1's
    # (scaled x8: Llama-3 matches none), its qwen3 235B-A22B has base 5e6 (the 2507 release;
    # the preset's public config has 1e6), Kimi-K2.5's YaRN factor is 64 (Kimi-K2: 32)
    assert ("qwen3", "235B-A22B") not in matched
    assert matched.get(("llama3", "70B")) == "llama-3.1-70b"
    assert ("kimi_k2_7", "Kimi-K2.5") not in matched


def _tt_layout(model: ModelSpec) -> Layout:
    pp, vpp = _interleaving(model.num_layers) or (2, 1)
    return Layout(
        tp=2,
        pp=pp,
        vpp=vpp,
        dp=8,
        ep=8 if model.is_moe else 1,
        grad_accum=2 * pp,
        zero=3,
        sequence_parallel=True,
        recompute="selective",
    )


TT_PRESETS = [
    name
    for name in PRESETS
    if (known := emit.torchtitan.torchtitan_model(_model(name))) and not known.refuse_03
]


def _deepseek_v3_without_mtp(directory: Path) -> str:
    """DeepSeek-V3's config.json without the MTP layer: torchtitan's deepseek_v3_671b."""
    import json

    config = json.loads((Path(__file__).parent / "data/deepseek-v3-config.json").read_text())
    path = directory / "deepseek-v3-no-mtp.json"
    path.write_text(json.dumps(config | {"num_nextn_predict_layers": 0}))
    return str(path)


@pytest.mark.parametrize("name", [*TT_PRESETS, "deepseek-v3 without MTP"])
def test_torchtitan_config_manager_reads_every_expressible_preset(name, tmp_path):
    """torchtitan 0.3's own ConfigManager on each preset it can express, interleaved PP and, for
    MoE, EP over the FSDP x TP ranks: the run it builds is the model and layout planned."""
    if name == "deepseek-v3 without MTP":
        name = _deepseek_v3_without_mtp(tmp_path)
    model = _model(name)
    lay = _tt_layout(model)
    problem = _problem(name, lay, "bf16")
    config = consumers.torchtitan_parse(emit.torchtitan_args(lay, problem))
    built = consumers.torchtitan_architecture(config.model_spec.model)
    assert tuple(built.values()) == emit.torchtitan.architecture(model)
    par = config.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (lay.tp, lay.pp)
    assert (par.data_parallel_shard_degree, par.expert_parallel_degree) == (lay.dp, lay.ep)
    assert par.context_parallel_degree == 1 and par.enable_sequence_parallel
    schedule = "Interleaved1F1B" if lay.vpp > 1 else "1F1B"
    assert par.pipeline_parallel_schedule == schedule
    stages = consumers.torchtitan_stage_layers(model.num_layers, _parallelism_fields(par))
    assert stages == emit.common.virtual_stage_layers(
        model.num_layers, lay.pp, lay.vpp, mtp_layers=model.num_mtp_layers
    )
    assert config.training.global_batch_size == problem.training.global_batch_sequences
    assert type(config.activation_checkpoint).__qualname__ == "SelectiveAC.Config"


def _parallelism_fields(par) -> dict:
    names = (
        "pipeline_parallel_degree",
        "pipeline_parallel_schedule",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers",
    )
    return {name: getattr(par, name) for name in names}


@pytest.mark.parametrize("name", ["deepseek-v3", "kimi-k2", "llama-3.1-405b", "qwen3-235b-a22b"])
def test_torchtitan_refuses_presets_it_cannot_express_in_one_line(name):
    problem = autopar.make_problem(model=name, gpus=64, seq_len=4096, global_batch=64)
    with pytest.raises(InputError) as error:
        emit.torchtitan_args(_tt_layout(problem.model), problem)
    message = str(error.value)
    assert "\n" not in message and "cannot express" in message and "--format" in message
    if name == "deepseek-v3":  # the one difference is named
        assert "num_mtp_layers 0 (the model has 1)" in message


def test_checkpoint_settings_reach_each_consumer() -> None:
    """The goodput-optimal interval and the async save, parsed by each consumer itself:
    Megatron-LM's parser, Megatron-Bridge's CheckpointConfig, torchtitan 0.3's ConfigManager."""
    import autopar

    # Llama-3.1: torchtitan's llama3_8b config is Llama-3.1's (RoPE scaled x8)
    options = dict(model="llama-3.1-8b", gpus=64, global_batch=256, async_checkpoint=True)
    est = autopar.evaluate(**options, tp=1, pp=1, zero=3, framework="torchtitan")
    problem = autopar.make_problem(**options, framework="torchtitan")
    interval = est.goodput.checkpoint_interval_steps
    args = consumers.megatron_parse(emit.megatron_args(est, problem))
    assert args["--save-interval"] == [str(interval)]
    assert "--async-save" in args and "--use-persistent-ckpt-worker" in args
    overrides = emit.bridge_overrides(autopar.evaluate(**options), autopar.make_problem(**options))
    assert overrides["checkpoint"]["async_save"] is True
    consumers.bridge_check(overrides)
    config = consumers.torchtitan_parse(emit.torchtitan_args(est, problem))
    assert config.checkpoint.interval == interval
    assert config.checkpoint.async_mode == "async"


def test_torchtitan_splits_a_per_stage_v_plan_as_autopar_priced_it():
    """A per-stage ZB-V plan (chunks r and 2pp-1-r on rank r) written for torchtitan: its own
    ``ConfigManager`` reads the arguments, and its own split
    (``_get_pipeline_metadata`` / ``_generate_llm_fqn_per_model_part``) gives the chunks, in
    model order, that autopar priced."""
    from autopar import api
    from autopar.layout.stages import parse_plan

    problem = api.make_problem(
        model="llama-3.1-70b", gpus=1024, seq_len=8192, global_batch=1024, framework="torchtitan"
    )
    layout = api.layout_of(
        problem, tp=8, pp=4, vpp=2, zero=3, recompute="selective", pipeline_schedule="zb-v",
        pipeline_plan="per-stage",
    )  # fmt: skip
    plan = parse_plan(
        pp=4, vpp=2, stage_layers="7,11,11,11,11,11,11,7", stage_recompute="selective",
        placement="v",
    )  # fmt: skip
    staged = api.evaluate_problem(problem, layout, plan=plan)
    config = consumers.torchtitan_parse(emit.torchtitan_args(staged, problem))
    assert config.parallelism.pipeline_parallel_schedule == "ZBVZeroBubble"
    parallelism = emit.torchtitan_config(staged, problem)["parallelism"]
    layers = consumers.torchtitan_stage_layers(problem.model.num_layers, parallelism)
    assert layers == list(staged.per_stage.plan.chunk_layers)
