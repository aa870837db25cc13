"""Megatron's rotary embedding: when it runs unfused and what that costs in HBM bytes
(``compute.attention_block_time_s`` prices the fused kernel otherwise)."""

from __future__ import annotations

import numpy as np

from autopar.inputs.specs import ModelSpec

FUSED_ROPE_BYTES = (4.0, 8.0)
"""HBM bytes per query / key element of Transformer Engine's fused rotary embedding, forward and
backward: each BF16 element read and written once (2 + 2), the backward's gradient twice."""

UNFUSED_ROPE_BYTES = (24.0, 20.0)
"""HBM bytes per query / key element of Megatron's unfused rotary embedding, forward and
backward (``rope_utils.py`` ``_apply_rotary_pos_emb_bshd`` L92-126 at core_v0.17.0, BF16):
``t * cos`` (4), ``_rotate_half``'s negation and ``torch.cat`` (2 + 4), ``* sin`` (4), the sum (6)
and the closing ``torch.cat((t, t_pass))`` (4) = 24 forward; autograd's backward multiplies the
gradient by ``sin`` and ``cos`` (4 + 4), undoes the negation and the chunking (2 + 4) and sums
the two paths (6) = 20, where the fused kernel (the default term) reads and writes each element
once (4 forward, 8 backward). Counted op by op, not fitted."""


def yarn_concentration(model: ModelSpec) -> float:
    """Megatron's YaRN concentration factor (``yarn_rotary_pos_embedding.py``
    ``_yarn_get_mscale`` / ``_yarn_get_concentration_factor`` L252-271 at core_v0.17.0):
    ``0.1 * mscale * ln(factor) + 1`` over the same with ``mscale_all_dim``; 1 without YaRN."""
    rope = model.rope
    if rope.scaling != "yarn" or rope.factor <= 1.0:
        return 1.0

    def mscale(m: float) -> float:
        return 0.1 * m * float(np.log(rope.factor)) + 1.0

    return mscale(rope.mscale) / mscale(rope.mscale_all_dim)


def rope_unfused(model: ModelSpec) -> bool:
    """Whether Megatron applies the rotary embedding unfused: Transformer Engine's fused RoPE
    takes no scale, so a YaRN concentration factor other than 1 falls back to
    ``_apply_rotary_pos_emb_bshd`` ("mscale ... is not supported by TE's fused RoPE. Using
    unfused implementation.", ``rope_utils.py`` L268-283 at core_v0.17.0; the attention passes
    the factor, ``attention.py`` L1105-1125). GPT-OSS: factor 32 with Megatron-Bridge's
    ``yarn_mscale = None`` (``gpt_oss_bridge.py`` L94-100 at v0.4.0) gives 0.1 ln 32 + 1 = 1.35
    (the HF config names no mscale: the preset's defaults 1 / 0 give the same). MLA applies its
    own RoPE (``mla_block_time_s``); DeepSeek-V3's mscale = mscale_all_dim gives 1."""
    return model.kv_lora_rank == 0 and abs(yarn_concentration(model) - 1.0) > 1e-9


def rope_bytes(model: ModelSpec) -> tuple[float, float]:
    """HBM bytes per query / key element, forward and backward, of the rotary embedding as
    Megatron runs it for ``model`` (``rope_unfused``)."""
    return UNFUSED_ROPE_BYTES if rope_unfused(model) else FUSED_ROPE_BYTES
