"""FLOP counts of one optimizer step, from the model's shapes (DESIGN §4 "FLOPs").

A GEMM of ``(m x k) @ (k x n)`` costs ``2*m*n*k`` FLOPs. Per token, one layer's forward runs

- QKV projection ``2*h*(q + 2*kv)`` (GQA shrinks K and V), output projection ``2*q*h``;
- attention scores ``Q K^T`` and ``softmax @ V``: ``2*s*q`` each, i.e. ``4*s*q`` per token
  (``4*b*s^2*h`` per sequence for MHA, Narayanan et al. 2021 appendix);
- MLP: ``2*h*f`` per matrix, 3 matrices for SwiGLU, 2 for GELU / squared-ReLU;
- MoE layers: the router ``2*h*E``, ``top_k`` routed experts and the shared expert;

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

from autopar.specs import ModelSpec
from autopar.terms import Grid, TermContext
from cost_models.shapes import kv_size, query_size

RECOMPUTE_SELECTIVE = 1
RECOMPUTE_FULL = 2


def attention_linear_flop_per_token(model: ModelSpec) -> float:
    """QKV + output projection of one layer, forward."""
    h, q, kv = model.hidden_size, query_size(model), kv_size(model)
    return 2.0 * (h * (q + 2 * kv) + q * h)


def attention_core_flop_per_token(model: ModelSpec, seq_len: int, *, causal: bool) -> float:
    """Scores and values of one layer, forward: ``4*s*q`` (half when causal)."""
    return 4.0 * seq_len * query_size(model) * (0.5 if causal else 1.0)


def mlp_flop_per_token(model: ModelSpec, ffn: int) -> float:
    """One MLP of inner size ``ffn``, forward."""
    return 2.0 * model.mlp_matrices * model.hidden_size * ffn


def moe_mlp_flop_per_token(model: ModelSpec) -> float:
    """Router + top-k routed experts + shared expert of one MoE layer, forward."""
    router = 2.0 * model.hidden_size * model.num_experts
    routed = model.experts_per_token * mlp_flop_per_token(model, model.expert_ffn_hidden_size)
    shared = mlp_flop_per_token(model, model.shared_expert_ffn_hidden_size)
    return router + routed + shared


def logits_flop_per_token(model: ModelSpec) -> float:
    return 2.0 * model.hidden_size * model.vocab_size


def layers_forward_flop_per_token(model: ModelSpec, seq_len: int, *, causal: bool) -> float:
    """All transformer layers, forward, per token (no logits)."""
    per_layer = attention_linear_flop_per_token(model) + attention_core_flop_per_token(
        model, seq_len, causal=causal
    )
    dense_mlp = model.num_dense_layers * mlp_flop_per_token(model, model.ffn_hidden_size)
    moe_mlp = model.num_moe_layers * moe_mlp_flop_per_token(model) if model.is_moe else 0.0
    return model.num_layers * per_layer + dense_mlp + moe_mlp


def model_flop_per_sequence(model: ModelSpec, seq_len: int, *, causal: bool = False) -> float:
    """Model FLOPs of one sequence (forward + backward, no recompute): 3 x forward."""
    forward = layers_forward_flop_per_token(model, seq_len, causal=causal) + logits_flop_per_token(
        model
    )
    return 3.0 * seq_len * forward


def recompute_flop_per_sequence(
    model: ModelSpec, seq_len: int, recompute: np.ndarray, *, causal: bool = False
) -> np.ndarray:
    """Extra forward FLOPs re-executed by activation recomputation, per sequence."""
    full = seq_len * layers_forward_flop_per_token(model, seq_len, causal=causal)
    selective = (
        seq_len * model.num_layers * attention_core_flop_per_token(model, seq_len, causal=causal)
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
