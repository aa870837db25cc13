"""Uneven and interleaved pipeline splits as Megatron does them (issue 11): the rule agrees
with a direct enumeration of Megatron's three options, the VPP domain covers every value with
whole layers per virtual stage, and Llama-3.1 405B's published layouts evaluate and fit."""

from __future__ import annotations

import numpy as np
import pytest

import autopar
from autopar.base.errors import InputError
from autopar.layout.rules import pipeline_split, uneven_split_ok
from autopar.layout.space import build_space
from cost_models.pipeline import first_stage_layers


def megatron_accepts(layers: int, pp: int, vpp: int) -> bool:
    """Megatron's options enumerated directly (transformer_config.py uneven-PP checks and
    transformer_block.py get_num_layers_to_build), keeping only splits whose fullest stage holds
    ceil(L/pp) layers (what the cost terms charge)."""
    if pp == 1:
        return vpp == 1
    m = -(-layers // pp)
    if layers % (pp * vpp) == 0:
        return True
    for embedding in (0, 1):
        for loss in (0, 1):
            slots = layers + embedding + loss
            if embedding + loss and slots % pp == 0 and (slots // pp) % vpp == 0:
                sizes = [slots // pp] * pp
                sizes[0] -= embedding
                sizes[-1] -= loss
                if max(sizes) <= m:
                    return True
    for first in range(vpp, m + 1, vpp):
        for last in range(vpp, m + 1, vpp):
            middle = layers - first - last
            if pp == 2 and middle == 0:
                return True
            if pp > 2 and middle == (pp - 2) * m and m % vpp == 0:
                return True
    return False


@pytest.mark.parametrize("layers", [24, 32, 61, 80, 96, 126])
def test_rule_matches_megatron_options(layers: int) -> None:
    for pp in range(1, min(layers, 40) + 1):
        for vpp in range(1, 17):
            expected = megatron_accepts(layers, pp, vpp)
            assert bool(uneven_split_ok(layers, np.array([pp]), vpp)[0]) == expected, (pp, vpp)
            if expected:
                assert pipeline_split(layers, pp, vpp) is not None


def test_llama_405b_flags() -> None:
    split = pipeline_split(126, 8, 8)  # 126 + 2 = 8 * 16: embedding and loss take a slot each
    assert (split.account_for_embedding, split.account_for_loss) == (True, True)
    assert split.first_stage_layers is None
    assert pipeline_split(126, 16, 2).account_for_embedding
    assert pipeline_split(126, 5, 1).first_stage_layers == 24  # 126 = 24 + 3*26 + 24
    assert pipeline_split(126, 6, 3) == pipeline_split(126, 6, 1)  # even: no flags
    assert pipeline_split(126, 6, 2) is None  # 21 layers per rank do not halve


def test_first_stage_layers() -> None:
    assert first_stage_layers(126, np.array([1, 6, 8, 16]))[:4].tolist() == [126, 21, 15, 7]
    assert first_stage_layers(80, np.array([8]))[0] == 10


def test_vpp_domain_covers_whole_layers_per_virtual_stage() -> None:
    problem = autopar.make_problem(model="nemotron-4-340b", gpus=128, seq_len=4096, global_batch=32)
    vpp = build_space(problem).domains["vpp"]
    assert 12 in vpp and 96 in vpp  # 96 layers at PP 8: VP 12 is one layer per virtual stage
    capped = autopar.make_problem(
        model="nemotron-4-340b", gpus=128, seq_len=4096, global_batch=32, limits={"vpp": 8}
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
        uneven_pipeline=True,
    )
    assert estimate.fits


def test_uneven_needs_the_option() -> None:
    with pytest.raises(InputError, match="layers vs PP"):
        autopar.evaluate(model="llama-3.1-405b", gpus=1024, seq_len=8192, tp=8, pp=8, vpp=8)


def test_solver_may_interleave_an_uneven_pipeline() -> None:
    result = autopar.solve(
        model="llama-3.1-405b",
        gpus=1024,
        seq_len=8192,
        global_batch=1536,
        uneven_pipeline=True,
        tp=8,
        pp=8,
        cp=2,
        precision="fp8",
        stack="megatron-bridge-25.09",
    )
    assert result.status == "optimal"
    assert result.best.layout.vpp > 1
