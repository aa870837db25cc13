"""FLOP counts of one optimizer step, from the model's shapes (DESIGN §4 "FLOPs").

A GEMM of ``(m x k) @ (k x n)`` costs ``2*m*n*k`` FLOPs. Per token, one layer's forward runs

- QKV projection ``2*h*(q + 2*kv)`` (GQA shrinks K and V), output projection ``2*q*h``;
- attention scores ``Q K^T`` and ``softmax @ V``: ``2*s*q`` each, i.e. ``4*s*q`` per token
  (``4*b*s^2*h`` per sequence for MHA, Narayanan et al. 2021 appendix);
- MLP: ``2*h*f`` per matrix, 3 matrices for SwiGLU, 2 for GELU / squared-ReLU;
- MoE layers: the router ``2*h*E``, ``top_k`` routed experts and the shared expert;
- other layer kinds (``ModelSpec.layer_kinds``): multi-latent attention (its five projections and
  a core over ``d_nope + d_rope`` and ``d_v``), sliding / chunked attention (the core over the
  window), Mamba-2 mixers (Megatron's count), MLP-only and mixer-only layers (Nemotron-H), and
  the MTP modules (their layer, projection and second logits pass);

plus the logits ``2*h*V`` per token (once, not per layer). Backward is twice the forward, so model
FLOPs are ``3 x forward`` (Korthikanti et al. 2022 Eq. 7; the NVIDIA dgxc-benchmarking "model
flops" constants). Norms, biases, softmax and activations are not counted (no published formula
counts them; they are memory-bound and timed by bytes in ``compute.py``).

**Causal attention.** Every published convention (Narayanan Eq. 3, Korthikanti Eq. 7, Megatron's
``num_floating_point_operations`` up to 2024, NVIDIA dgxc "attention flops ... (sequence length) /
(hidden size)") counts the full ``s x s`` score matrix. ``TransformerFlops.causal_attention=False``
(the default) keeps that convention so MFU compares with published MFU; ``True`` halves the
attention-core FLOPs (what a causal flash-attention kernel executes).

**Recompute** (hardware FLOPs only): full recompute adds one forward of every transformer layer
(not the logits), which turns ``3x`` into ``4x`` forward: Narayanan Eq. 3
``96*B*s*l*h^2*(1 + s/6h + V/16lh)``. Selective recompute adds one forward of the attention core
(``4*s*q`` per token per layer). Korthikanti Eq. 8 adds ``72*B*L*s*h^2 * s/6h``, which is three
times that (the forward *and* backward of the core); autopar counts only what is re-executed, the
test ``test_cost_flops.py`` pins the factor of 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.costs.terms import Grid, TermContext
from autopar.inputs.specs import ModelSpec
from cost_models.shapes import (
    kv_size,
    mamba_in_proj_size,
    mla_projection_sizes,
    query_size,
)

RECOMPUTE_SELECTIVE = 1
RECOMPUTE_FULL = 2


def attention_linear_flop_per_token(model: ModelSpec) -> float:
    """QKV + output projection of one layer, forward."""
    h, q, kv = model.hidden_size, query_size(model), kv_size(model)
    return 2.0 * (h * (q + 2 * kv) + q * h)


def attention_keys(model: ModelSpec, mixer: str, seq_len: int) -> int:
    """Keys each query attends to: ``s``, or the window of a sliding / chunked layer."""
    if mixer == "sliding":
        return min(seq_len, model.attention_window)
    return seq_len


def attention_core_flop_per_token(
    model: ModelSpec, seq_len: int, *, causal: bool, mixer: str = "attention"
) -> float:
    """Scores and values of one layer, forward: ``4*s*q`` (half when causal), ``s`` the keys a
    query sees. MLA: ``2*s*n*(d_nope + d_rope)`` for the scores and ``2*s*n*d_v`` for the values
    (Megatron ``training.py`` ``num_floating_point_operations``, MLA branch)."""
    keys = attention_keys(model, mixer, seq_len) * (0.5 if causal else 1.0)
    if mixer == "mla":
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        return 2.0 * keys * model.num_attention_heads * (qk + model.v_head_dim)
    if mixer in ("attention", "sliding"):
        return 4.0 * keys * query_size(model)
    return 0.0


def mla_linear_flop_per_token(model: ModelSpec) -> float:
    """MLA projections, forward (``shapes.mla_projection_sizes``)."""
    return 2.0 * sum(i * o for i, o in mla_projection_sizes(model).values())


def mamba_flop_per_token(model: ModelSpec) -> float:
    """One Mamba-2 mixer, forward: in_proj, the SSD scan and out_proj, as Megatron counts them
    (``training.py`` ``mamba_layer_flops``: ``2*h*in_proj + 7*d_inner*d_state + 2*d_inner*h``;
    the scan term follows the chunked SSD algorithm, Dao & Gu 2024 §6)."""
    h, d_inner = model.hidden_size, model.mamba_inner_size
    return (
        2.0 * h * mamba_in_proj_size(model)
        + 7.0 * d_inner * model.mamba_state_size
        + (2.0 * d_inner * h)
    )


def mixer_flop_per_token(model: ModelSpec, mixer: str, seq_len: int, *, causal: bool) -> float:
    """One layer's token mixer, forward, per token."""
    core = attention_core_flop_per_token(model, seq_len, causal=causal, mixer=mixer)
    if mixer in ("attention", "sliding"):
        return attention_linear_flop_per_token(model) + core
    if mixer == "mla":
        return mla_linear_flop_per_token(model) + core
    if mixer == "mamba":
        return mamba_flop_per_token(model)
    return 0.0


def mlp_flop_per_token(model: ModelSpec, ffn: int) -> float:
    """One MLP of inner size ``ffn``, forward."""
    return 2.0 * model.mlp_matrices * model.hidden_size * ffn


def moe_mlp_flop_per_token(model: ModelSpec) -> float:
    """Router + top-k routed experts + shared expert of one MoE layer, forward."""
    router = 2.0 * model.hidden_size * model.num_experts
    routed = model.experts_per_token * mlp_flop_per_token(model, model.expert_ffn_hidden_size)
    shared = mlp_flop_per_token(model, model.shared_expert_ffn_hidden_size)
    return router + routed + shared


def ffn_flop_per_token(model: ModelSpec, ffn: str) -> float:
    if ffn == "dense":
        return mlp_flop_per_token(model, model.ffn_hidden_size)
    if ffn == "moe":
        return moe_mlp_flop_per_token(model)
    return 0.0


def kind_flop_per_token(model: ModelSpec, kind: str, seq_len: int, *, causal: bool) -> float:
    """One layer of ``kind`` (``"mixer/ffn"``), forward, per token."""
    mixer, _, ffn = kind.partition("/")
    return mixer_flop_per_token(model, mixer, seq_len, causal=causal) + ffn_flop_per_token(
        model, ffn
    )


def logits_flop_per_token(model: ModelSpec) -> float:
    """The output layer, once per prediction head: the main one and each MTP module (Megatron
    ``training.py``: ``2*s*h*V*(1 + mtp_num_layers)``)."""
    return 2.0 * model.hidden_size * model.vocab_size * (1 + model.num_mtp_layers)


def layers_forward_flop_per_token(model: ModelSpec, seq_len: int, *, causal: bool) -> float:
    """All transformer layers (MTP modules included: their layer and ``2h -> h`` projection),
    forward, per token (no logits)."""
    counts = kind_counts(model)
    layers = sum(
        n * kind_flop_per_token(model, kind, seq_len, causal=causal) for kind, n in counts.items()
    )
    projection = model.num_mtp_layers * 2.0 * (2 * model.hidden_size) * model.hidden_size
    return layers + projection


def kind_counts(model: ModelSpec) -> dict[str, int]:
    """Layers of each kind, the MTP modules' layers included."""
    counts: dict[str, int] = {}
    for kind in model.layer_kinds:
        counts[kind] = counts.get(kind, 0) + 1
    if model.num_mtp_layers:
        kind = model.mtp_layer_kind
        counts[kind] = counts.get(kind, 0) + model.num_mtp_layers
    return counts


def model_flop_per_sequence(model: ModelSpec, seq_len: int, *, causal: bool = False) -> float:
    """Model FLOPs of one sequence (forward + backward, no recompute): 3 x forward."""
    forward = layers_forward_flop_per_token(model, seq_len, causal=causal) + logits_flop_per_token(
        model
    )
    return 3.0 * seq_len * forward


def recompute_flop_per_sequence(
    model: ModelSpec, seq_len: int, recompute: np.ndarray, *, causal: bool = False
) -> np.ndarray:
    """Extra forward FLOPs re-executed by activation recomputation, per sequence: every layer
    (full) or the attention cores (selective)."""
    full = seq_len * layers_forward_flop_per_token(model, seq_len, causal=causal)
    selective = seq_len * sum(
        n * attention_core_flop_per_token(model, seq_len, causal=causal, mixer=kind.split("/")[0])
        for kind, n in kind_counts(model).items()
    )
    code = np.asarray(recompute)
    return np.where(
        code == RECOMPUTE_FULL, full, np.where(code == RECOMPUTE_SELECTIVE, selective, 0.0)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerFlops:
    """The default ``FlopCounter``: model FLOPs (MFU) and executed FLOPs (HFU) of one step."""

    causal_attention: bool = False
    """Count half the ``s x s`` attention FLOPs; ``False`` matches every published MFU."""

    def model_flop(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        per_sequence = model_flop_per_sequence(
            ctx.model, ctx.training.seq_len, causal=self.causal_attention
        )
        return np.asarray(per_sequence * ctx.training.global_batch_sequences, dtype=np.float64)

    def hardware_flop(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        extra = recompute_flop_per_sequence(
            ctx.model, ctx.training.seq_len, grid["recompute"], causal=self.causal_attention
        )
        return self.model_flop(grid, ctx) + extra * ctx.training.global_batch_sequences
