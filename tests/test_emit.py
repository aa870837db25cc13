"""Emitters (autopar.emit): Megatron-LM arguments, torchtitan TOML, DeepSpeed JSON.

Flag and field names are checked against the frameworks' own sources (see autopar/emit.py).
"""

from __future__ import annotations

import shlex
import tomllib

import pytest

import autopar
from autopar import emit
from autopar.errors import InputError
from autopar.plan import Layout

# megatron/training/arguments.py (NVIDIA/Megatron-LM): the flags the emitter may use.
MEGATRON_FLAGS = {
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--micro-batch-size",
    "--global-batch-size",
    "--seq-length",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--bf16",
    "--fp8-format",
}
# torchtitan/config/job_config.py (pytorch/torchtitan): Parallelism, Training, ActivationCheckpoint.
TORCHTITAN_FIELDS = {
    "parallelism": {
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "context_parallel_degree",
        "expert_parallel_degree",
    },
    "training": {"local_batch_size", "global_batch_size", "seq_len"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
}


@pytest.fixture(scope="module")
def dense():
    return autopar.make_problem(model="llama-70b", gpus=64, seq_len=4096, global_batch=64)


@pytest.fixture(scope="module")
def moe():
    return autopar.make_problem(
        model="mixtral-8x7b", gpus=64, seq_len=4096, global_batch=256, precision="fp8"
    )


def _args(line: str) -> dict[str, str | None]:
    tokens = shlex.split(line)
    out: dict[str, str | None] = {}
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            out[token] = None if nxt is None or nxt.startswith("--") else nxt
    return out


INTERLEAVED = Layout(tp=4, pp=4, dp=4, vpp=2, mbs=1, grad_accum=16, zero=1, sequence_parallel=True)


def test_megatron_interleaved_dense(dense):
    args = _args(emit.megatron_args(INTERLEAVED, dense))
    assert set(args) <= MEGATRON_FLAGS
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
    assert set(args) <= MEGATRON_FLAGS
    assert args["--expert-model-parallel-size"] == "8"
    assert args["--expert-tensor-parallel-size"] == "1"
    assert args["--fp8-format"] == "hybrid"
    assert args["--recompute-granularity"] == "full"
    assert args["--recompute-method"] == "uniform" and args["--recompute-num-layers"] == "1"
    assert "--use-distributed-optimizer" not in args and "--overlap-grad-reduce" not in args
    assert "--num-layers-per-virtual-pipeline-stage" not in args


def test_megatron_rejects_uneven_virtual_stages(dense):
    with pytest.raises(InputError, match="vpp"):
        emit.megatron_args(Layout(tp=8, pp=2, dp=4, vpp=3, grad_accum=16), dense)


def test_torchtitan_interleaved_ddp(dense):
    config = tomllib.loads(emit.torchtitan_toml(INTERLEAVED, dense))
    for section, keys in config.items():
        assert set(keys) <= TORCHTITAN_FIELDS[section], section
    par = config["parallelism"]
    assert par["tensor_parallel_degree"] == 4 and par["pipeline_parallel_degree"] == 4
    assert par["data_parallel_replicate_degree"] == 4 and par["data_parallel_shard_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_microbatch_size"] == 1
    # with PP, local_batch_size is one DP rank's batch per step, split into micro-batches
    assert config["training"] == {"local_batch_size": 16, "global_batch_size": 64, "seq_len": 4096}
    assert config["activation_checkpoint"]["mode"] == "none"


def test_torchtitan_fsdp_selective(dense):
    lay = Layout(tp=8, pp=1, dp=4, cp=2, mbs=2, grad_accum=8, zero=3, recompute="selective")
    config = tomllib.loads(emit.torchtitan_toml(lay, dense))
    par = config["parallelism"]
    assert par["data_parallel_shard_degree"] == 4 and par["data_parallel_replicate_degree"] == 1
    assert par["context_parallel_degree"] == 2
    assert "pipeline_parallel_schedule" not in par
    assert config["training"]["local_batch_size"] == 2  # no PP: grad accumulation from global
    assert config["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_deepspeed_fields(dense):
    config = emit.deepspeed_json(INTERLEAVED, dense)
    assert config["train_batch_size"] == 64 == dense.training.global_batch_sequences
    assert config["train_micro_batch_size_per_gpu"] == 1
    assert config["gradient_accumulation_steps"] == 16
    assert config["zero_optimization"] == {"stage": 1}
    assert config["bf16"] == {"enabled": True}
    assert config["tensor_parallel"] == {"autotp_size": 4}
    assert config["pipeline"] == {"stages": 4}


def test_deepspeed_rejects_context_parallel(dense):
    with pytest.raises(InputError, match="context parallel"):
        emit.deepspeed_json(Layout(tp=8, pp=1, dp=4, cp=2, grad_accum=16), dense)


def test_deepspeed_config_loads_in_deepspeed(dense, monkeypatch):
    """DeepSpeed itself accepts the config and agrees on the batch arithmetic."""
    from deepspeed.runtime import config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)  # no process group here

    class Mpu:  # DeepSpeed's world size for batch checks is the data-parallel size
        def get_data_parallel_world_size(self) -> int:
            return INTERLEAVED.dp

    config = ds_config.DeepSpeedConfig(emit.deepspeed_json(INTERLEAVED, dense), mpu=Mpu())
    assert config.train_batch_size == 64
    assert config.gradient_accumulation_steps == 16
    assert config.zero_optimization_stage == 1
    assert config.pipeline["stages"] == 4
    assert config.bfloat16_config.enabled


def test_emitters_accept_an_estimate(dense):
    est = autopar.evaluate(
        model="llama-70b", gpus=64, seq_len=4096, global_batch=64, tp=4, pp=4, vpp=2
    )
    assert emit.megatron_args(est, dense) == emit.megatron_args(est.layout, dense)


def test_bf16_gradients_reach_the_framework_configs():
    problem = autopar.make_problem(
        model="llama-70b", gpus=64, seq_len=4096, global_batch=64, grad_precision="bf16"
    )
    assert "--grad-reduce-in-bf16" in emit.megatron_args(INTERLEAVED, problem).split()
    assert emit.deepspeed_json(INTERLEAVED, problem)["communication_data_type"] == "bf16"
    fp32 = autopar.make_problem(model="llama-70b", gpus=64, seq_len=4096, global_batch=64)
    assert "--grad-reduce-in-bf16" not in emit.megatron_args(INTERLEAVED, fp32)
    assert "communication_data_type" not in emit.deepspeed_json(INTERLEAVED, fp32)


def test_uneven_pipeline_split_reaches_megatron():
    """Llama-3.1 405B has 126 layers: PP 8 splits as 15 + 6 x 16 + 15."""
    problem = autopar.make_problem(
        model="llama-3.1-405b", gpus=1024, seq_len=8192, global_batch=512, uneven_pipeline=True
    )
    args = emit.megatron_args(Layout(tp=8, pp=8, dp=16, grad_accum=32), problem).split()
    first = args[args.index("--decoder-first-pipeline-num-layers") + 1]
    last = args[args.index("--decoder-last-pipeline-num-layers") + 1]
    assert int(first) + int(last) + 6 * 16 == 126 and int(first) <= 16 and int(last) <= 16
