"""Pipeline splits (issues 20, 21): one split for the rule, the cost model and the launchers;
every pipeline size up to the layer count, as Megatron accepts it, and the split Megatron builds
from autopar's flags is the split autopar priced (checked with megatron-core's own code)."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from autopar.base.errors import InputError
from autopar.layout.plan import Layout
from autopar.layout.space import build_space
from autopar.layout.split import max_chunks, pipeline_split, split_ok, stage_split
from autopar.outputs import emit
from cost_models.pipeline import first_stage_layers
from cost_models.shapes import stage_bounds
from tests import consumers

pytestmark = pytest.mark.xdist_group("torch")  # one worker imports torch (tests/conftest.py)


@pytest.mark.parametrize("layers", [24, 32, 61, 80, 96, 126])
def test_every_split_holds_every_layer_and_the_fullest_stage_is_the_ceiling(layers: int) -> None:
    for pp in range(1, layers + 1):
        stages = stage_split(layers, pp, mtp_layers=layers % 2)
        assert len(stages) == pp and sum(stages) == layers and min(stages) >= 1
        assert max(stages) == -(-layers // pp)  # what cost_models.shapes.stage_layers charges
        for vpp in range(1, 18):
            split = pipeline_split(layers, pp, vpp, mtp_layers=layers % 2)
            assert (split is not None) == (vpp <= max_chunks(stages) and (pp > 1 or vpp == 1))
            if split is None:
                continue
            assert split.stage_layers == stages  # the stage split does not depend on vpp
            chunks = split.chunk_layers
            assert len(chunks) == pp * vpp and sum(chunks) == layers
            assert all(sum(chunks[j * pp + i] for j in range(vpp)) == stages[i] for i in range(pp))
            inner = chunks[1:-1]
            assert not inner or min(inner) >= 1  # only an end chunk may hold no layer
            ways = (
                split.layout is not None,
                split.first_stage_layers is not None,
                split.account_for_embedding or split.account_for_loss,
            )
            assert sum(ways) <= 1


def test_the_rule_agrees_with_the_split() -> None:
    pp = np.repeat(np.arange(1, 70), 40)
    vpp = np.tile(np.arange(1, 41), 69)
    ok = split_ok(61, pp, vpp, mtp_layers=1)
    expected = [
        pipeline_split(61, p, v, mtp_layers=1) is not None for p, v in zip(pp, vpp, strict=True)
    ]
    assert ok.tolist() == expected


@pytest.mark.parametrize(
    ("model", "gpus", "pp", "vpp"),
    [
        ("deepseek-v3", 1024, 8, 4),  # Megatron-Bridge's DeepSeek-V3 layout: 61 layers + MTP
        ("deepseek-v3", 1024, 4, 2),
        ("deepseek-v3", 1024, 8, 1),  # first/last counts, the MTP module on the last stage
        ("deepseek-v3", 1024, 2, 1),  # 31 / 30 + MTP: first/last counts, no middle stage
        ("deepseek-v3", 1024, 2, 4),  # the same split in chunks: a layout
        ("deepseek-v3", 1024, 4, 1),  # 15 / 16 / 16 / 14 + MTP
        ("llama-3.1-405b", 1024, 8, 8),  # embedding and loss accounted
        ("llama-3.1-405b", 1024, 8, 16),  # the embedding and the loss alone in their chunks
        ("llama-3.1-405b", 1024, 6, 2),  # even stages, uneven chunks: a layout
        ("llama-3.1-405b", 1024, 16, 1),
        ("llama-3-70b", 992, 31, 1),  # 80 layers over 31 stages
        ("llama-3-70b", 1024, 8, 5),  # even
        ("qwen3-30b-a3b", 320, 5, 1),
    ],
)
def test_megatron_builds_the_split_autopar_priced(model, gpus, pp, vpp) -> None:
    """megatron-core's TransformerConfig from the emitted flags, and its own layer counts per
    virtual stage, equal autopar's chunks; the cost model's stages are the same split."""
    problem = autopar.make_problem(model=model, gpus=gpus, global_batch=gpus)
    spec = problem.model
    split = pipeline_split(spec.num_layers, pp, vpp, mtp_layers=spec.num_mtp_layers)
    dp = gpus // (2 * pp)
    lay = Layout(tp=2, pp=pp, dp=dp, vpp=vpp, grad_accum=pp, sequence_parallel=True)
    config = consumers.megatron_transformer_config(emit.megatron_args(lay, problem))
    assert consumers.megatron_chunk_layers(config) == list(split.chunk_layers)
    bounds = stage_bounds(spec.num_layers, pp, last_extra_layers=spec.num_mtp_layers)
    assert tuple(end - start for start, end in bounds) == split.stage_layers


def test_known_splits() -> None:
    assert pipeline_split(126, 8, 8).account_for_embedding  # 15 + 6 x 16 + 15, 2-slot chunks
    assert pipeline_split(126, 8, 8).account_for_loss
    assert pipeline_split(126, 5, 1).first_stage_layers == 24  # 126 = 24 + 3*26 + 24
    assert pipeline_split(126, 6, 3).chunk_layers == (7,) * 18  # even: no flags
    assert pipeline_split(126, 6, 2).layout.startswith("Et*10|t*11|")
    deepseek = pipeline_split(61, 8, 1, mtp_layers=1)
    assert deepseek.stage_layers == (7, 8, 8, 8, 8, 8, 8, 6)  # the MTP module counts on the last
    assert pipeline_split(61, 8, 4, mtp_layers=1).layout.endswith("|tmL")
    # one slot short, MTP on the last stage: balanced counting it (account-for gave 30 / 31+MTP)
    assert pipeline_split(61, 2, 1, mtp_layers=1).stage_layers == (31, 30)
    assert pipeline_split(61, 2, 1).account_for_embedding  # no MTP: Megatron's own 30 / 31
    assert pipeline_split(80, 81, 1) is None and pipeline_split(4, 1, 2) is None


def test_first_stage_layers() -> None:
    assert first_stage_layers(126, np.array([1, 6, 8, 16])).tolist() == [126, 21, 15, 7]
    assert first_stage_layers(80, np.array([8, 31]))[0] == 10


def test_vpp_domain_covers_every_chunk_count() -> None:
    problem = autopar.make_problem(model="nemotron-4-340b", gpus=128, seq_len=4096, global_batch=32)
    vpp = build_space(problem).domains["vpp"]
    assert {12, 13, 48} <= set(vpp)  # 96 layers at PP 8: VP 12 is one layer per virtual stage
    capped = autopar.make_problem(
        model="nemotron-4-340b", gpus=128, seq_len=4096, global_batch=32, max_vpp=8
    )
    assert max(build_space(capped).domains["vpp"]) == 8


@pytest.mark.parametrize(
    ("gpus", "pp", "vpp", "cp", "batch", "stack"),
    [
        (1024, 8, 8, 2, 1536, "megatron-bridge-25.09"),  # Megatron-Bridge 25.09-26.06
        (16384, 16, 8, 1, 2048, "megatron-bridge-25.09"),  # PP 16 interleaved, 8k
        (16384, 16, 8, 16, 128, "megatron-bridge-25.09"),  # 128k tokens: CP 16
    ],
)
def test_llama_405b_published_layouts_evaluate_and_fit(gpus, pp, vpp, cp, batch, stack) -> None:
    seq = 131072 if cp == 16 else 8192
    estimate = autopar.evaluate(
        model="llama-3.1-405b",
        gpus=gpus,
        seq_len=seq,
        global_batch=batch,
        precision="fp8",
        stack=stack,
        tp=8,
        pp=pp,
        vpp=vpp,
        cp=cp,
    )
    assert estimate.fits


def test_deepseek_v3_bridge_layout_evaluates_by_default() -> None:
    """Issue 20: the layout Megatron-Bridge publishes for DeepSeek-V3 (PP 8 VP 4, 61 layers)."""
    estimate = autopar.evaluate(
        model="deepseek-v3", gpus=1024, global_batch=8192, tp=2, pp=8, vpp=4, ep=64
    )
    assert estimate.step_time_s > 0


def test_even_pipeline_restricts_to_even_splits() -> None:
    with pytest.raises(InputError, match="layers vs PP"):
        autopar.evaluate(
            model="llama-3.1-405b",
            gpus=1024,
            seq_len=8192,
            tp=8,
            pp=8,
            vpp=8,
            uneven_pipeline=False,
        )


def test_solver_may_interleave_an_uneven_pipeline() -> None:
    result = autopar.solve(
        model="llama-3.1-405b",
        gpus=1024,
        seq_len=8192,
        global_batch=1536,
        tp=8,
        pp=8,
        cp=2,
        precision="fp8",
        stack="megatron-bridge-25.09",
    )
    assert result.status == "optimal"
    assert result.best.layout.vpp > 1


def test_splits_hold_python_ints_whoever_asks_first() -> None:
    """The rule asks with numpy integers, which share the cache key of Python ones: a split
    cached from them held numpy integers, and torchtitan's TOML then quoted the layer counts
    (``pipeline_parallel_last_stage_less_layers = "0"``) depending on the order of the calls."""
    stage_split.cache_clear()
    assert split_ok(61, np.array([4, 8]), np.array([1, 2])).tolist() == [True, True]
    for split in (stage_split(61, 4), stage_split(61, np.int64(8)), stage_split(80, 2)):
        assert split and all(type(n) is int for n in split)
