"""Emitters (autopar.outputs.emit): Megatron-LM arguments, Megatron-Bridge overrides, torchtitan 0.3
command lines and 0.2 TOML, DeepSpeed JSON.

Flag and field names are checked against the consumers (tests/consumers.py); the matrix over
all presets is tests/test_emit_consumers.py.
"""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

import autopar
from autopar.base.errors import InputError
from autopar.layout.plan import Layout
from autopar.outputs import emit
from tests import consumers

pytestmark = pytest.mark.xdist_group("torch")  # one worker imports torch (tests/conftest.py)


@pytest.fixture(scope="module")
def dense():
    return autopar.make_problem(model="llama-70b", gpus=64, seq_len=4096, global_batch=64)


@pytest.fixture(scope="module")
def moe():
    return autopar.make_problem(
        model="mixtral-8x7b", gpus=64, seq_len=4096, global_batch=256, precision="fp8"
    )


def _args(line: str) -> dict[str, str | None]:
    """Flag -> its value (None for a switch), every flag known to Megatron-LM's parser."""
    return {flag: (v[0] if v else None) for flag, v in consumers.megatron_parse(line).items()}


INTERLEAVED = Layout(tp=4, pp=4, dp=4, vpp=2, mbs=1, grad_accum=16, zero=1, sequence_parallel=True)


def test_megatron_interleaved_dense(dense):
    args = _args(emit.megatron_args(INTERLEAVED, dense))
    assert args["--tensor-model-parallel-size"] == "4"
    assert args["--pipeline-model-parallel-size"] == "4"
    assert args["--num-layers-per-virtual-pipeline-stage"] == "10"  # 80 / (4 * 2)
    assert args["--global-batch-size"] == "64"
    assert args["--seq-length"] == "4096"
    assert "--sequence-parallel" in args and "--use-distributed-optimizer" in args
    assert "--overlap-param-gather" in args and "--bf16" in args
    assert "--expert-model-parallel-size" not in args  # dense model
    assert "--fp8-format" not in args and "--recompute-granularity" not in args


def test_megatron_moe_fp8_full_recompute(moe):
    lay = Layout(tp=2, pp=2, dp=16, ep=8, mbs=1, grad_accum=16, recompute="full", zero=0)
    args = _args(emit.megatron_args(lay, moe))
    assert args["--expert-model-parallel-size"] == "8"
    assert args["--expert-tensor-parallel-size"] == "1"
    assert args["--fp8-format"] == "hybrid" and args["--fp8-recipe"] == "delayed"
    assert args["--moe-token-dispatcher-type"] == "alltoall"  # what the cost model times
    assert args["--num-experts"] == "8" and args["--moe-router-topk"] == "2"
    assert args["--recompute-granularity"] == "full"
    assert args["--recompute-method"] == "uniform" and args["--recompute-num-layers"] == "1"
    assert "--use-distributed-optimizer" not in args and "--overlap-param-gather" not in args
    assert "--overlap-grad-reduce" in args  # the megatron-lm stack overlaps DDP's reduction too
    assert "--num-layers-per-virtual-pipeline-stage" not in args


def test_megatron_rejects_virtual_stages_left_without_layers(dense):
    """80 layers over PP 2: 41 virtual stages per rank fill (the embedding and the loss alone in
    an end chunk), 42 would leave one empty (``autopar.layout.split.max_chunks``)."""
    emit.megatron_args(Layout(tp=8, pp=2, dp=4, vpp=41, grad_accum=16), dense)
    with pytest.raises(InputError, match="vpp"):
        emit.megatron_args(Layout(tp=8, pp=2, dp=4, vpp=42, grad_accum=16), dense)


def test_megatron_writes_the_layout_when_no_split_flag_gives_the_split(dense):
    """80 layers over PP 2 x VPP 3: no even, account-for or first/last split gives 40 layers per
    rank in 3 chunks, so the layout flag says it; megatron-core builds exactly that split."""
    line = emit.megatron_args(Layout(tp=8, pp=2, dp=4, vpp=3, grad_accum=16), dense)
    args = _args(line)
    assert args["--pipeline-model-parallel-layout"] == "Et*13|t*14|t*13|t*13|t*14|t*13L"
    assert "--num-virtual-stages-per-pipeline-rank" not in args
    config = consumers.megatron_transformer_config(line)
    assert consumers.megatron_chunk_layers(config) == [13, 14, 13, 13, 14, 13]


TT_FIELDS = consumers.vendored("torchtitan-0.2.2-job-config.json")["sections"]
INTERLEAVED_DDP = Layout(tp=4, pp=4, dp=4, vpp=2, grad_accum=16, sequence_parallel=True)


def test_torchtitan_02_interleaved_ddp(dense):
    config = tomllib.loads(emit.torchtitan_toml(INTERLEAVED_DDP, dense))
    for section, keys in config.items():
        assert set(keys) <= set(TT_FIELDS[section]), section
    par = config["parallelism"]
    assert par["tensor_parallel_degree"] == 4 and par["pipeline_parallel_degree"] == 4
    assert par["data_parallel_replicate_degree"] == 4 and par["data_parallel_shard_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    # 80 layers over 4 x 2 stages, embedding and output not counted as layers
    assert par["pipeline_parallel_layers_per_stage"] == 10
    assert par["pipeline_parallel_first_stage_less_layers"] == 0
    assert par["pipeline_parallel_last_stage_less_layers"] == 0
    assert consumers.torchtitan_stage_layers(80, {k: v for k, v in par.items()}) == [10] * 8
    # with PP, local_batch_size is one DP rank's batch per step, split into micro-batches
    assert config["training"] == {"local_batch_size": 16, "global_batch_size": 64, "seq_len": 4096}
    assert config["activation_checkpoint"]["mode"] == "none"
    # torchtitan's 70B flavor is Llama-3.1's (RoPE scaled x8): Llama-3 70B is not named
    assert "model" not in config
    llama31 = autopar.make_problem(model="llama-3.1-70b", gpus=64, seq_len=4096, global_batch=64)
    config31 = tomllib.loads(emit.torchtitan_toml(INTERLEAVED_DDP, llama31))
    assert config31["model"] == {"name": "llama3", "flavor": "70B"}


def test_torchtitan_02_fsdp_selective(dense):
    lay = Layout(
        tp=8,
        pp=1,
        dp=4,
        cp=2,
        mbs=2,
        grad_accum=8,
        zero=3,
        recompute="selective",
        sequence_parallel=True,
    )
    config = tomllib.loads(emit.torchtitan_toml(lay, dense))
    par = config["parallelism"]
    assert par["data_parallel_shard_degree"] == 4 and par["data_parallel_replicate_degree"] == 1
    assert par["context_parallel_degree"] == 2
    assert "pipeline_parallel_schedule" not in par
    assert config["training"]["local_batch_size"] == 2  # no PP: grad accumulation from global
    assert config["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_torchtitan_refuses_zero1_and_keeps_etp(moe):
    with pytest.raises(InputError, match="cannot express ZeRO-1.*--format"):
        emit.torchtitan_args(INTERLEAVED, moe)
    lay = Layout(tp=2, pp=1, dp=32, ep=8, etp=2, grad_accum=8, zero=3, sequence_parallel=True)
    with pytest.raises(InputError, match="etp=2"):
        emit.torchtitan_args(lay, moe)  # 0.3 has no expert TP
    config = emit.torchtitan_config(lay, moe)  # 0.2 allows etp = tp
    assert config["parallelism"]["expert_tensor_parallel_degree"] == 2
    assert config["model"]["converters"] == ["quantize.linear.float8", "quantize.grouped_mm.float8"]


def test_torchtitan_03_uneven_pipeline():
    """Qwen3-30B's 48 layers over PP 5: torchtitan's split equals Megatron's (embedding and loss
    each in a layer's slot, torchtitan's own default accounting)."""
    problem = autopar.make_problem(model="qwen3-30b-a3b", gpus=320, global_batch=640)
    lay = Layout(tp=4, pp=5, dp=16, grad_accum=40, zero=3, sequence_parallel=True)
    args = emit.torchtitan_args(lay, problem)
    assert args[:4] == ["--module", "qwen3", "--config", "qwen3_30b_a3b"]
    par = {
        a[len("--parallelism.") :]: int(v) if v.isdigit() else v
        for a, v in zip(args, args[1:], strict=False)
        if a.startswith("--parallelism.")
    }
    stages = consumers.torchtitan_stage_layers(48, par)
    assert stages == [9, 10, 10, 10, 9] == emit.common.virtual_stage_layers(48, 5, 1)
    assert (
        par["pipeline_parallel_first_stage_less_layers"],
        par["pipeline_parallel_last_stage_less_layers"],
        par["pipeline_parallel_layers_per_stage"],
    ) == (1, 1, 10)


def test_torchtitan_03_refuses_405b_whose_only_config_is_fp8():
    """torchtitan 0.3's llama3_405b converts the linears to FP8 rowwise: a BF16 plan would run
    in another precision, so 0.3 refuses it and the 0.2 TOML (which names its converters) stays."""
    problem = autopar.make_problem(model="llama-3.1-405b", gpus=1024, global_batch=512)
    lay = Layout(tp=8, pp=8, dp=16, grad_accum=32, zero=3, sequence_parallel=True)
    with pytest.raises(InputError, match="llama3_405b, trains in FP8.*--format torchtitan-0.2"):
        emit.torchtitan_args(lay, problem)
    assert emit.torchtitan_config(lay, problem)["model"] == {"name": "llama3", "flavor": "405B"}


def test_deepspeed_fields(dense):
    lay = Layout(tp=4, pp=4, dp=4, grad_accum=16, zero=1, recompute="full")
    config = emit.deepspeed_json(lay, dense)
    assert config["train_batch_size"] == 64 == dense.training.global_batch_sequences
    assert config["train_micro_batch_size_per_gpu"] == 1
    assert config["gradient_accumulation_steps"] == 16
    assert config["zero_optimization"] == {"stage": 1}
    assert config["bf16"] == {"enabled": True}
    assert config["tensor_parallel"] == {"autotp_size": 4}
    assert config["pipeline"] == {"activation_checkpoint_interval": 1}  # never "stages"
    assert config["communication_data_type"] == "fp32"  # as planned, not DeepSpeed's bf16
    assert emit.deepspeed_notes(lay, dense) == (
        "DeepSpeed 0.19.8 config for llama-3-70b (JSON has no comments): "
        "TP 4 x PP 4 x DP 4 = 64 GPUs.",
        "DeepSpeed: the config has no pipeline size; build the model as "
        "PipelineModule(layers, topology=PipeModelDataParallelTopology(num_pp=4, num_mp=4, "
        "num_dp=4)) (the topology sets num_stages: runtime/pipe/module.py, "
        "runtime/pipe/topology.py).",
    )


@pytest.mark.parametrize(
    "layout, what",
    [
        (Layout(tp=4, pp=4, dp=4, vpp=2, grad_accum=16), "interleaved pipeline"),
        (Layout(tp=8, pp=1, dp=8, ep=8, grad_accum=8), "expert parallelism"),
        (Layout(tp=8, pp=1, dp=8, etp=2, grad_accum=8), "expert tensor parallelism"),
        (Layout(tp=8, pp=2, dp=4, grad_accum=16, sequence_parallel=True), "sequence parallelism"),
        (Layout(tp=8, pp=2, dp=4, grad_accum=16, zero=3), "ZeRO-3 with pipeline"),
    ],
)
def test_deepspeed_refuses_what_it_cannot_express(dense, layout, what):
    with pytest.raises(InputError, match=f"cannot express .*{what}.*--format megatron"):
        emit.deepspeed_json(layout, dense)


def test_deepspeed_rejects_context_parallel(dense):
    with pytest.raises(InputError, match="context parallel"):
        emit.deepspeed_json(Layout(tp=8, pp=1, dp=4, cp=2, grad_accum=16), dense)


def test_deepspeed_config_loads_in_deepspeed(dense):
    """DeepSpeed itself accepts the config and agrees on the batch arithmetic."""
    lay = Layout(tp=4, pp=4, dp=4, grad_accum=16, zero=1)
    config = consumers.deepspeed_config(emit.deepspeed_json(lay, dense), lay.dp)
    assert config.train_batch_size == 64
    assert config.gradient_accumulation_steps == 16
    assert config.zero_optimization_stage == 1
    assert config.bfloat16_config.enabled


def test_emitters_accept_an_estimate(dense):
    est = autopar.evaluate(
        model="llama-70b", gpus=64, seq_len=4096, global_batch=64, tp=4, pp=4, vpp=2
    )
    # the estimate also carries the checkpoint interval that maximises goodput (issue 22)
    interval = est.goodput.checkpoint_interval_steps
    expected = f"{emit.megatron_args(est.layout, dense)} --save-interval {interval}"
    assert emit.megatron_args(est, dense) == expected


def test_bf16_gradients_reach_the_framework_configs():
    problem = autopar.make_problem(
        model="llama-70b", gpus=64, seq_len=4096, global_batch=64, grad_precision="bf16"
    )
    plain = Layout(tp=4, pp=4, dp=4, grad_accum=16, zero=1)
    assert "--grad-reduce-in-bf16" in emit.megatron_args(INTERLEAVED, problem).split()
    assert emit.deepspeed_json(plain, problem)["communication_data_type"] == "bf16"
    with pytest.raises(InputError, match="grad_reduce_in_fp32"):
        emit.bridge_overrides(plain, problem)  # the Bridge recipe would reduce in FP32
    fp32 = autopar.make_problem(model="llama-70b", gpus=64, seq_len=4096, global_batch=64)
    assert "--grad-reduce-in-bf16" not in emit.megatron_args(INTERLEAVED, fp32)
    assert emit.deepspeed_json(plain, fp32)["communication_data_type"] == "fp32"


@pytest.mark.parametrize(
    "pp, flags",
    [
        # 126 = 15 + 6 x 16 + 15: the embedding and the loss take a layer's slot at the ends
        (
            8,
            {
                "--account-for-embedding-in-pipeline-split": None,
                "--account-for-loss-in-pipeline-split": None,
            },
        ),
        # 126 = 24 + 3 x 26 + 24: first/last-stage layer counts
        (
            5,
            {
                "--decoder-first-pipeline-num-layers": "24",
                "--decoder-last-pipeline-num-layers": "24",
            },
        ),
    ],
)
def test_uneven_pipeline_split_reaches_megatron(pp, flags):
    """Llama-3.1 405B's 126 layers: the split autopar.layout.split.pipeline_split planned."""
    problem = autopar.make_problem(
        model="llama-3.1-405b", gpus=1024, seq_len=8192, global_batch=512, uneven_pipeline=True
    )
    args = _args(emit.megatron_args(Layout(tp=8, pp=pp, dp=16, grad_accum=32), problem))
    assert {k: args.get(k, "absent") for k in flags} == flags
    config = consumers.megatron_transformer_config(
        emit.megatron_args(Layout(tp=8, pp=pp, dp=1), problem)
    )
    assert config.pipeline_model_parallel_size == pp


def test_interleaved_uneven_split_uses_virtual_stages_per_rank():
    """126 layers over PP 5 x VPP 2: 24 + 3 x 26 + 24 by rank, halved per chunk."""
    problem = autopar.make_problem(model="llama-3.1-405b", gpus=1024, global_batch=512)
    lay = Layout(tp=8, pp=5, dp=4, vpp=2, grad_accum=10, sequence_parallel=True)
    args = _args(emit.megatron_args(lay, problem))
    assert args["--num-virtual-stages-per-pipeline-rank"] == "2"
    assert "--num-layers-per-virtual-pipeline-stage" not in args
    assert emit.common.virtual_stage_layers(126, 5, 2) == [12, 13, 13, 13, 12] * 2
    seventy = autopar.make_problem(model="llama-3.1-70b", gpus=384, global_batch=512)
    assert emit.common.virtual_stage_layers(80, 6, 2) == [6, 7, 7, 7, 7, 6] * 2
    with pytest.raises(InputError, match="only the first and last virtual stage"):
        emit.torchtitan_args(
            Layout(tp=8, pp=6, dp=8, vpp=2, grad_accum=12, zero=3, sequence_parallel=True), seventy
        )


@pytest.mark.parametrize("zero, strategy", [(2, "optim_grads"), (3, "optim_grads_params")])
def test_megatron_zero_2_3_is_megatron_fsdp(zero, strategy):
    """ZeRO-2/3 must not come out as the distributed optimizer alone (that is ZeRO-1)."""
    problem = autopar.make_problem(model="llama-3.1-405b", gpus=4096, global_batch=2048)
    lay = Layout(tp=8, pp=8, dp=64, grad_accum=32, zero=zero, sequence_parallel=True)
    args = _args(emit.megatron_args(lay, problem))
    assert "--use-megatron-fsdp" in args and "--use-distributed-optimizer" in args
    assert args["--data-parallel-sharding-strategy"] == strategy
    assert args["--ckpt-format"] == "fsdp_dtensor"  # arguments.py:1170 requires it
    assert "unset" in emit.FORMATS["megatron"].text(lay, problem).splitlines()[2]


def test_megatron_architecture_of_gpt3():
    """GPT-3: learned positions, LayerNorm, GELU, biases, tied embeddings, MHA."""
    problem = autopar.make_problem(model="gpt3-175b", gpus=1024, seq_len=2048, global_batch=1536)
    args = _args(emit.megatron_args(Layout(tp=8, pp=16, dp=8, grad_accum=192), problem))
    assert args["--position-embedding-type"] == "learned_absolute"
    assert args["--normalization"] == "LayerNorm" and args["--max-position-embeddings"] == "2048"
    for absent in (
        "--swiglu",
        "--disable-bias-linear",
        "--untie-embeddings-and-output-weights",
        "--group-query-attention",
        "--num-experts",
    ):
        assert absent not in args
    assert args["--padded-vocab-size"] == "51200"  # 51200 is a multiple of 128 * 8
    header = emit.FORMATS["megatron"].text(Layout(tp=8, pp=16, dp=8), problem).splitlines()[0]
    assert "Megatron-Core 0.20.0" in header


def test_megatron_moe_layer_pattern_follows_decoder_sparse_step():
    """HF decoder_sparse_step 2: layers 1, 3, 5 ... are MoE; Megatron evaluates the pattern."""
    problem = autopar.make_problem(model="mixtral-8x7b", gpus=64, global_batch=256)
    model = dataclasses.replace(problem.model, moe_layer_freq=2, num_layers=31)
    problem = dataclasses.replace(problem, model=model)
    args = _args(emit.megatron_args(Layout(tp=8, pp=1, dp=8, ep=8, grad_accum=4), problem))
    pattern = eval(args["--moe-layer-freq"], {"__builtins__": {}})  # noqa: S307
    assert pattern == [i % 2 for i in range(31)]


def test_megatron_deepseek_v3_architecture():
    """MLA, dense-first layers, node-limited routing and MTP reach the arguments."""
    problem = autopar.make_problem(model="deepseek-v3", gpus=2048, global_batch=4096)
    model = problem.model
    lay = Layout(tp=2, pp=16, dp=64, ep=64, grad_accum=64, zero=1, sequence_parallel=True)
    args = _args(emit.megatron_args(lay, problem))
    assert "--multi-latent-attention" in args
    assert args["--kv-lora-rank"] == str(model.kv_lora_rank)
    assert args["--q-lora-rank"] == str(model.q_lora_rank)
    assert args["--qk-pos-emb-head-dim"] == str(model.qk_rope_head_dim)
    assert args["--mtp-num-layers"] == str(model.num_mtp_layers)
    pattern = eval(args["--moe-layer-freq"], {"__builtins__": {}})  # noqa: S307
    assert pattern == [int(kind.endswith("/moe")) for kind in model.layer_kinds]
    assert args["--moe-router-num-groups"] == str(model.moe_router_num_groups)
    config = consumers.megatron_transformer_config(emit.megatron_args(lay, problem))
    assert type(config).__name__ == "MLATransformerConfig"
    assert config.kv_lora_rank == model.kv_lora_rank and config.mtp_num_layers == 1


@pytest.mark.parametrize("fmt", ["megatron", "megatron-bridge"])
def test_layer_kinds_not_written_are_refused(fmt):
    """GPT-OSS alternates sliding-window layers and has attention sinks: refused, not dropped."""
    problem = autopar.make_problem(model="gpt-oss-120b", gpus=64, global_batch=64)
    with pytest.raises(InputError, match="sliding.*attention sinks.*Megatron-Bridge recipe"):
        emit.FORMATS[fmt].text(Layout(tp=8, pp=1, dp=8, ep=8, grad_accum=8), problem)


def test_megatron_p2p_overlap_follows_the_stack(dense):
    """megatron-lm stack: no P2P overlap planned, so Megatron's default overlap is turned off
    where Megatron allows it (pp > 2) and named in the header where it does not (pp = 2)."""
    four = _args(emit.megatron_args(INTERLEAVED, dense))
    assert "--no-overlap-p2p-communication" in four
    two = Layout(tp=8, pp=2, dp=4, vpp=2, grad_accum=16, zero=1, sequence_parallel=True)
    text = emit.FORMATS["megatron"].text(two, dense)
    assert "--no-overlap-p2p-communication" not in text and "PP 2 interleaved" in text
    nemo = autopar.make_problem(model="llama-70b", gpus=64, global_batch=64, stack="nemo-24.07")
    assert "--no-overlap-p2p-communication" not in emit.megatron_args(INTERLEAVED, nemo)
    assert "--tp-comm-overlap" in emit.megatron_args(INTERLEAVED, nemo)


def test_torchtitan_refuses_ep_whose_expert_mesh_torchtitan_cannot_build():
    """mixtral-8x7b on 64 GPUs, DDP, EP 8: torchtitan's expert mesh would be
    dp_shard*cp*tp // ep = 1 // 8 = 0 ranks (0.2.2 built it and failed at start); both emitters
    refuse, and torchtitan 0.3's own ParallelDims cannot build that mesh."""
    problem = autopar.make_problem(
        model="mixtral-8x7b", gpus=64, seq_len=4096, global_batch=64, framework="torchtitan"
    )
    ddp = Layout(tp=1, pp=1, dp=64, ep=8, zero=0)
    for fmt, emitter in (("torchtitan-0.2", emit.torchtitan_config), ("torchtitan", None)):
        with pytest.raises(InputError, match=f"--format {fmt}.*ep=8.*dp_shard\\*cp\\*tp = 1"):
            (emitter or emit.torchtitan_args)(ddp, problem)
    parallelism = dict(
        data_parallel_replicate_degree=64,
        data_parallel_shard_degree=1,
        tensor_parallel_degree=1,
        pipeline_parallel_degree=1,
        context_parallel_degree=1,
        expert_parallel_degree=8,
    )
    with pytest.raises(ValueError, match="is 0"):
        consumers.torchtitan_mesh(parallelism, 64)
    fsdp = Layout(tp=1, pp=1, dp=64, ep=8, zero=3)  # EP borrows FSDP ranks: accepted and buildable
    assert emit.torchtitan_config(fsdp, problem)["parallelism"]["data_parallel_shard_degree"] == 64
    consumers.torchtitan_mesh(
        parallelism | {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 64}, 64
    )


def test_fused_expert_mlp_is_megatrons_op_fuser_and_bridges_field():
    """``moe_fused_mlp``: Megatron ``--use-transformer-engine-op-fuser`` (transformer_config.py
    L525; its parser knows it), only for MoE models; Megatron-Bridge 0.6.2 sets the
    ``TransformerConfig`` field of the same name (megatron-core 0.19.2 has it; 0.3.1 had not)."""
    moe = autopar.make_problem(
        model="mixtral-8x7b", gpus=64, seq_len=4096, global_batch=256, moe_fused_mlp=True
    )
    lay = Layout(tp=1, pp=1, dp=64, ep=8, mbs=1, grad_accum=4, zero=1)
    assert "--use-transformer-engine-op-fuser" in _args(emit.megatron_args(lay, moe))
    off = autopar.make_problem(model="mixtral-8x7b", gpus=64, seq_len=4096, global_batch=256)
    assert "--use-transformer-engine-op-fuser" not in _args(emit.megatron_args(lay, off))
    model = emit.bridge_overrides(lay, moe)["model"]
    assert model["use_transformer_engine_op_fuser"] is True
    consumers.bridge_check(emit.bridge_overrides(lay, moe))
    assert "use_transformer_engine_op_fuser" not in emit.bridge_overrides(lay, off)["model"]
