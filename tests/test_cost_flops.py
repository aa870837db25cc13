"""FLOP counts of cost_models.flops against the published formulas.

Narayanan et al. 2021 Eq. 3 (with recompute), Korthikanti et al. 2022 Eq. 7-8, and the NVIDIA
dgxc-benchmarking model-FLOPs constants per sequence (``data/published/README.md``).
"""

from __future__ import annotations

import numpy as np
import pytest

from autopar.inputs.specs import ModelSpec
from cost_models.flops import model_flop_per_sequence, recompute_flop_per_sequence

GPT3 = ModelSpec(
    name="gpt3-175b",
    num_layers=96,
    hidden_size=12288,
    num_attention_heads=96,
    num_kv_heads=96,
    ffn_hidden_size=4 * 12288,
    vocab_size=51200,
    mlp_kind="gelu",
)


def llama(layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(
        name="llama",
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=8,
        ffn_hidden_size=ffn,
        vocab_size=128256,
    )


def eq7(s: int, h: int, n: int, v: int) -> float:
    """Korthikanti Eq. 7 per sequence: 72*L*s*h^2*(1 + s/6h + v/12hL)."""
    return 72.0 * n * s * h * h * (1 + s / (6 * h) + v / (12 * h * n))


def test_model_flop_equals_korthikanti_eq7() -> None:
    assert model_flop_per_sequence(GPT3, 2048) == pytest.approx(
        eq7(2048, 12288, 96, 51200), rel=1e-12
    )


def test_full_recompute_flop_equals_narayanan_eq3() -> None:
    s, h, n, v = 2048, 12288, 96, 51200
    eq3 = 96.0 * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    full = model_flop_per_sequence(GPT3, s) + recompute_flop_per_sequence(GPT3, s, np.array([2]))
    assert full[0] == pytest.approx(eq3, rel=1e-12)


def test_selective_recompute_is_a_third_of_korthikanti_eq8_extra() -> None:
    """Eq. 8 adds 72*L*s*h^2*s/6h = 3 attention-core forwards; autopar re-executes one."""
    s, h, n = 2048, 12288, 96
    eq8_extra = 72.0 * n * s * h * h * (s / (6 * h))
    ours = recompute_flop_per_sequence(GPT3, s, np.array([1]))[0]
    assert ours == pytest.approx(eq8_extra / 3.0, rel=1e-12)


def test_no_recompute_adds_nothing() -> None:
    assert recompute_flop_per_sequence(GPT3, 2048, np.array([0]))[0] == 0.0


@pytest.mark.parametrize(
    ("model", "seq_len", "published"),
    [
        (llama(32, 4096, 32, 14336), 8192, 4.74e14),  # Llama 3.1 8B
        (llama(80, 8192, 64, 28672), 8192, 3.94e15),  # Llama 3.1 70B
        (llama(126, 16384, 128, 53248), 8192, 2.17e16),  # Llama 3.1 405B
        (GPT3, 2048, 2.20e15),
        (
            ModelSpec(
                name="nemotron-4-340b",
                num_layers=96,
                hidden_size=18432,
                num_attention_heads=96,
                num_kv_heads=8,
                ffn_hidden_size=73728,
                vocab_size=256000,
                mlp_kind="squared_relu",
            ),
            4096,
            8.62e15,
        ),
    ],
)
def test_dgxc_model_flops_constants(model: ModelSpec, seq_len: int, published: float) -> None:
    """The dgxc 'model flops' per GBS=1 are per sequence at the model's training length
    (8192 for Llama 3.1, 2048 GPT-3, 4096 Nemotron-4), GQA and SwiGLU included."""
    assert model_flop_per_sequence(model, seq_len) == pytest.approx(published, rel=0.01)


def test_causal_attention_halves_only_the_attention_core() -> None:
    s = 2048
    full = model_flop_per_sequence(GPT3, s)
    causal = model_flop_per_sequence(GPT3, s, causal=True)
    attention_core = 3.0 * 96 * 4.0 * s * s * 12288
    assert full - causal == pytest.approx(attention_core / 2.0, rel=1e-12)


def test_a_geglu_mlp_has_the_three_matrices_of_a_gated_mlp() -> None:
    """GeGLU (Gemma) is gated like SwiGLU: gate, up and down projections, so its FLOPs are
    SwiGLU's and not a two-matrix GELU MLP's."""
    import dataclasses

    swiglu = llama(layers=4, hidden=1024, heads=8, ffn=4096)
    geglu = dataclasses.replace(swiglu, mlp_kind="geglu")
    gelu = dataclasses.replace(swiglu, mlp_kind="gelu")
    assert geglu.mlp_matrices == swiglu.mlp_matrices == 3 and gelu.mlp_matrices == 2
    assert model_flop_per_sequence(geglu, 2048) == model_flop_per_sequence(swiglu, 2048)
    assert model_flop_per_sequence(gelu, 2048) < model_flop_per_sequence(swiglu, 2048)
