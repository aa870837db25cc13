"""Tensor shapes of a decoder-only transformer: parameter counts and per-layer GEMMs.

Everything here is plain arithmetic on ``ModelSpec`` fields, vectorised over numpy arrays of
layout values (``tp``, ``cp``, ``mbs`` ...). Names follow Megatron-LM:

- ``q`` = ``kv_channels * num_attention_heads`` (query projection size, ``h`` for most models);
- ``kv`` = ``kv_channels * num_kv_heads`` (one of K or V; GQA shrinks it);
- ``f`` = ``ffn_hidden_size``; gated MLPs (SwiGLU) have an up *and* a gate projection.

Sources: parameter terms follow Megatron ``megatron/training/theoretical_memory_usage.py``
(``compute_weight_and_optimizer_memory``); vocabulary padding follows Megatron
``megatron/core/tensor_parallel`` / ``vocab_utils.py`` (multiple of ``128 * tp``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.costs.schedule_orders import chunk_of, chunk_stage
from autopar.costs.schedule_slots import in_flight_chunks
from autopar.inputs.specs import ModelSpec
from autopar.layout.split import stage_split

VOCAB_PAD_MULTIPLE = 128
"""Megatron ``--make-vocab-size-divisible-by`` default (arguments.py); padded to 128 * tp."""


def padded_vocab(model: ModelSpec, tp: np.ndarray | int) -> np.ndarray:
    """Vocabulary padded to a multiple of ``128 * tp`` (Megatron ``_vocab_size_with_padding``)."""
    multiple = VOCAB_PAD_MULTIPLE * np.asarray(tp, dtype=np.float64)
    return np.ceil(model.vocab_size / multiple) * multiple


def query_size(model: ModelSpec) -> int:
    return model.kv_channels * model.num_attention_heads


def kv_size(model: ModelSpec) -> int:
    return model.kv_channels * model.num_kv_heads


def norm_params(model: ModelSpec) -> int:
    """Parameters of one norm: weight (RMSNorm) or weight + bias (LayerNorm)."""
    return (2 if model.layernorm else 1) * model.hidden_size


def attention_params(model: ModelSpec) -> int:
    """QKV and output projections (with GQA), their biases, and the layer's input norm."""
    h, q, kv = model.hidden_size, query_size(model), kv_size(model)
    weights = h * (q + 2 * kv) + q * h
    biases = (q + 2 * kv + h) if model.linear_bias else 0
    return weights + biases + norm_params(model)


def mlp_params(model: ModelSpec, ffn: int) -> int:
    """One MLP of inner size ``ffn`` (2 or 3 matrices) with its biases (no norm)."""
    h = model.hidden_size
    up = (2 if model.gated_mlp else 1) * ffn
    biases = (up + h) if model.linear_bias else 0
    return h * up + ffn * h + biases


def mla_projection_sizes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """MLA linear layers as ``(in, out)`` (Megatron ``multi_latent_attention.py``,
    ``MLASelfAttention``: ``linear_q_down_proj`` / ``linear_q_up_proj`` (or ``linear_q_proj``
    when ``q_lora_rank`` is null), ``linear_kv_down_proj`` (latent + the shared RoPE key),
    ``linear_kv_up_proj``, ``linear_proj``; DeepSeek-V2 report §2.1.2 Eq. 9-19)."""
    h, n = model.hidden_size, model.num_attention_heads
    qk = model.qk_nope_head_dim + model.qk_rope_head_dim
    sizes = {
        "kv_down": (h, model.kv_lora_rank + model.qk_rope_head_dim),
        "kv_up": (model.kv_lora_rank, n * (model.qk_nope_head_dim + model.v_head_dim)),
        "out": (n * model.v_head_dim, h),
    }
    if model.q_lora_rank:
        sizes["q_down"] = (h, model.q_lora_rank)
        sizes["q_up"] = (model.q_lora_rank, n * qk)
    else:
        sizes["q"] = (h, n * qk)
    return sizes


MLA_REPLICATED = ("q_down", "kv_down")
"""MLA projections Megatron does not split over TP (``linear_q_down_proj`` and
``linear_kv_down_proj`` are built with ``parallel_mode="duplicated"``)."""


def mla_params(model: ModelSpec) -> int:
    """MLA projections, the latent norms (q and kv ``layernorm``) and the layer's input norm."""
    weights = sum(i * o for i, o in mla_projection_sizes(model).values())
    latent_norms = model.kv_lora_rank + model.q_lora_rank
    return weights + latent_norms + norm_params(model)


def mamba_in_proj_size(model: ModelSpec) -> int:
    """Mamba-2 ``in_proj`` output: z and x (``2*d_inner``), B and C (``2*ngroups*d_state``) and
    dt (``nheads``) (Megatron ``ssm/mamba_mixer.py``; Dao & Gu 2024 §7.1)."""
    return (
        2 * model.mamba_inner_size
        + 2 * model.mamba_num_groups * model.mamba_state_size
        + model.mamba_num_heads
    )


def mamba_conv_channels(model: ModelSpec) -> int:
    """Channels of the depthwise causal convolution: x, B and C."""
    return model.mamba_inner_size + 2 * model.mamba_num_groups * model.mamba_state_size


def mamba_params(model: ModelSpec) -> int:
    """One Mamba-2 mixer with its input norm: in_proj, conv1d (weight + bias), dt_bias, A_log, D,
    the gated RMSNorm over ``d_inner`` and out_proj (Megatron ``ssm/mamba_mixer.py``)."""
    h, d_inner, heads = model.hidden_size, model.mamba_inner_size, model.mamba_num_heads
    conv = mamba_conv_channels(model) * (model.mamba_conv_kernel + 1)
    return (h * mamba_in_proj_size(model) + conv + 3 * heads + d_inner + d_inner * h) + norm_params(
        model
    )


def mixer_params(model: ModelSpec, mixer: str) -> int:
    """Parameters of one layer's token mixer with its input norm (0 for ``none``)."""
    if mixer in ("attention", "sliding"):
        sinks = model.num_attention_heads if model.attention_sinks else 0
        return attention_params(model) + sinks
    if mixer == "mla":
        return mla_params(model)
    if mixer == "mamba":
        return mamba_params(model)
    return 0


def router_params(model: ModelSpec) -> int:
    return model.hidden_size * model.num_experts + (model.num_experts if model.linear_bias else 0)


def ffn_non_expert_params(model: ModelSpec, ffn: str) -> int:
    """The part of one layer's MLP that lives on the dense (TP) grid, with its norm: a dense MLP,
    or an MoE layer's router and shared expert (Megatron shards the shared expert with TP)."""
    if ffn == "dense":
        return mlp_params(model, model.ffn_hidden_size) + norm_params(model)
    if ffn == "moe":
        shared = model.shared_expert_ffn_hidden_size
        return (
            router_params(model) + (mlp_params(model, shared) if shared else 0) + norm_params(model)
        )
    return 0


def expert_params(model: ModelSpec) -> int:
    """All routed experts of one MoE layer."""
    return model.num_experts * mlp_params(model, model.expert_ffn_hidden_size)


def kind_params(model: ModelSpec, kind: str) -> int:
    """Dense-grid parameters of one layer of ``kind`` (``"mixer/ffn"``)."""
    mixer, _, ffn = kind.partition("/")
    return mixer_params(model, mixer) + ffn_non_expert_params(model, ffn)


def mtp_extra_params(model: ModelSpec) -> int:
    """One MTP module besides its transformer layer: the ``2h -> h`` projection and the two
    input norms (DeepSeek-V3 report §2.2; Megatron ``multi_token_prediction.py``: ``enorm``,
    ``hnorm``, ``eh_proj``) plus its final norm; embedding and output are shared."""
    return 2 * model.hidden_size * model.hidden_size + 3 * norm_params(model)


def dense_layer_params(model: ModelSpec) -> int:
    """The largest dense-grid layer (what ZeRO-3 gathers at a time)."""
    return max(kind_params(model, kind) for kind in set(model.layer_kinds))


def stage_layers(num_layers: int, pp) -> np.ndarray:
    """Layers on the fullest pipeline stage: ``ceil(num_layers / pp)`` for every split
    ``autopar.layout.split.stage_split`` makes (even, account-for, first/last, balanced)."""
    return np.ceil(num_layers / np.asarray(pp, dtype=np.float64))


def stage_bounds(num_layers: int, pp: int, *, last_extra_layers: int = 0) -> list[tuple[int, int]]:
    """``[start, end)`` of each stage's layers in the split autopar plans and launches
    (``autopar.layout.split.stage_split``; ``last_extra_layers``: the MTP modules, which count
    on the last stage)."""
    bounds, start = [], 0
    for size in stage_split(num_layers, pp, mtp_layers=last_extra_layers):
        bounds.append((start, start + size))
        start += size
    return bounds


def stage_kinds(model: ModelSpec, pp: int, stage: int) -> dict[str, int]:
    """Layer kinds held by one pipeline stage; MTP modules sit on the last stage (Megatron
    ``multi_token_prediction.py``: ``mtp_on_this_rank`` is the last pipeline stage)."""
    return dict(all_stage_kinds(model, pp)[stage])


@functools.lru_cache(maxsize=256)
def all_stage_kinds(model: ModelSpec, pp: int) -> tuple[dict[str, int], ...]:
    """``stage_kinds`` of every stage, in one pass over the layers. Loops over the stages use
    this: asking ``stage_kinds`` stage by stage cost O(layers) each (the split, then hashing the
    model's per-layer kinds), and a 4096-layer model at PP 4096 took minutes. Memoised per
    (model, pp); the dicts are shared, read them only."""
    bounds = stage_bounds(model.num_layers, pp, last_extra_layers=model.num_mtp_layers)
    kinds = model.layer_kinds
    out = []
    for stage, (start, end) in enumerate(bounds):
        counts: dict[str, int] = {}
        for kind in kinds[start:end]:
            counts[kind] = counts.get(kind, 0) + 1
        if stage == pp - 1 and model.num_mtp_layers:
            kind = model.mtp_layer_kind
            counts[kind] = counts.get(kind, 0) + model.num_mtp_layers
        out.append(counts)
    return tuple(out)


def heaviest_stage(
    model: ModelSpec,
    pp: np.ndarray,
    *,
    weight: Callable[[str], float],
    last_stage_extra: float = 0.0,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per layout row, the layer-kind counts of the stage with the most ``weight`` (FLOPs for
    time: with dense-first layers, MTP or an uneven split the stages differ, and the most
    loaded one sets the pace), and whether that stage is the last one (which also carries
    ``last_stage_extra``: the output layer); vectorised over the distinct ``pp`` values."""
    pp = np.atleast_1d(np.asarray(pp, dtype=np.int64))
    kinds = sorted({*model.layer_kinds, model.mtp_layer_kind})
    out = {kind: np.zeros(len(pp)) for kind in kinds}
    is_last = np.zeros(len(pp), dtype=bool)
    weights = {kind: weight(kind) for kind in kinds}
    for value in np.unique(pp):
        stages = all_stage_kinds(model, int(value))
        loads = [sum(n * weights[k] for k, n in c.items()) for c in stages]
        loads[-1] += last_stage_extra
        index = int(np.argmax(loads))
        rows = pp == value
        is_last[rows] = index == int(value) - 1
        for kind, count in stages[index].items():
            out[kind][rows] = count
    return out, is_last


def stage_kind_counts(
    model: ModelSpec, pp: np.ndarray, *, weight: Callable[[str], float]
) -> dict[str, np.ndarray]:
    """The layer-kind counts of ``heaviest_stage``."""
    return heaviest_stage(model, pp, weight=weight)[0]


def peak_in_flight_stage_bytes(
    model: ModelSpec,
    pp: np.ndarray,
    per_kind_bytes: Callable[[str], np.ndarray | float],
    *,
    first_stage_extra: np.ndarray | float = 0.0,
    last_stage_extra: np.ndarray | float = 0.0,
    schedule: np.ndarray | None = None,
    vpp: np.ndarray | None = None,
    grad_accum: np.ndarray | None = None,
) -> np.ndarray:
    """Activation bytes of one micro-batch on the stage whose activations in flight peak highest,
    scaled to the first stage's in-flight count (the ``in_flight`` term multiplies it back).
    Rows of a schedule other than 1F1B (``schedule``, with ``vpp`` and ``grad_accum``) are
    counted chunk by chunk (``_scheduled_peak``); the 1F1B ones as follows.

    Under 1F1B stage ``i`` of ``p`` holds ``p - i`` micro-batches at its peak (Narayanan et al.
    2021 §2.2; Megatron ``schedules.py`` warm-up count ``p - i - 1`` plus the one in flight), the
    first stage ``p``. With equal stages the first one peaks; with dense-first layers
    (DeepSeek-V3: 3 dense then MoE), MTP on the last stage or an uneven split, a later stage
    can hold more: ``max_i (p - i)/p * bytes_i``. ``per_kind_bytes(kind)`` gives one layer's
    bytes per row; ``first_stage_extra`` (the embedding's) sits on stage 0 only. With fewer
    micro-batches than stages the ratio ``(p - i)/p`` understates the later stages (they hold
    ``min(p - i, m)``); the first stage's count is then ``m`` as well.

    ``last_stage_extra`` (the loss's logits, ``LogitsMemory``) sits with the last stage's
    micro-batches on the rows of the other schedules only: under GPipe and Looped BFS the last
    stage runs every forward, its loss included, before the first backward, so it holds all
    ``m`` micro-batches' logits, and a V puts the last stage on the first rank; under 1F1B the
    last stage holds one micro-batch and the first stage's ``p`` dominate, as before."""
    pp = np.atleast_1d(np.asarray(pp, dtype=np.int64))
    out = np.zeros(len(pp))
    cache: dict[str, np.ndarray] = {}

    def kind_bytes(kind: str) -> np.ndarray:
        if kind not in cache:
            cache[kind] = np.broadcast_to(np.asarray(per_kind_bytes(kind), float), (len(pp),))
        return cache[kind]

    extra = np.broadcast_to(np.asarray(first_stage_extra, dtype=np.float64), (len(pp),))
    last = np.broadcast_to(np.asarray(last_stage_extra, dtype=np.float64), (len(pp),))
    other = np.zeros(len(pp), dtype=bool)
    if schedule is not None:
        other = ~np.isin(np.asarray(schedule), [PIPELINE_SCHEDULES.index(n) for n in ONE_F_ONE_B])
        out[other] = _scheduled_peak(
            model,
            [np.asarray(x)[other] for x in (schedule, pp, vpp, grad_accum)],
            lambda kind: kind_bytes(kind)[other],
            (extra[other], last[other]),
        )
    plain = np.flatnonzero(~other)
    plain = plain[np.argsort(pp[plain], kind="stable")]  # by pp, each value's rows in order
    values, starts = np.unique(pp[plain], return_index=True)
    ends = [*starts[1:].tolist(), len(plain)][: len(starts)]
    for value, start, end in zip(values.tolist(), starts.tolist(), ends, strict=True):
        rows = plain[start:end]
        peak = np.zeros(len(rows))
        kinds_of = all_stage_kinds(model, value)
        for i in _extreme_stages(model, value):
            total = extra[rows] if i == 0 else np.zeros(len(rows))
            for kind, count in kinds_of[i].items():
                total = total + count * kind_bytes(kind)[rows]
            peak = np.maximum(peak, total * (value - i) / value)
        out[rows] = peak
    return out


@functools.lru_cache(maxsize=256)
def _extreme_stages(model: ModelSpec, pp: int) -> tuple[int, ...]:
    """The stages whose 1F1B peak can be the largest: stage 0 (the embedding's) and, of the
    later stages holding the same layer kinds in the same order, the first and the last. Over
    those a row's bytes are one value ``t`` and its peak ``t * (pp - i) / pp`` is monotone in
    ``i``, so its largest is at one end, the same figure as over every stage (issue 23: at
    PP 80 every row looped over 80 stages)."""
    first: dict[tuple, int] = {}
    last: dict[tuple, int] = {}
    for i, kinds in enumerate(all_stage_kinds(model, pp)[1:], start=1):
        key = tuple(kinds.items())
        first.setdefault(key, i)
        last[key] = i
    return tuple(sorted({0, *first.values(), *last.values()}))


ONE_F_ONE_B = ("1f1b", "combined-1f1b")
"""The schedules whose peak keeps Korthikanti's stage-level count (``(p - i)/p`` of the first
stage's), on which the memory of the published runs was validated."""


def _scheduled_peak(model: ModelSpec, columns, kind_bytes, extras) -> np.ndarray:
    """``max over ranks`` of the bytes a rank holds at its peak over the first rank's count in
    stages: each chunk's layers (virtual stage ``c*p + r``, or ``r`` and ``2p-1-r`` in a V) times
    the micro-batches it holds then (``autopar.costs.schedule_slots.in_flight_chunks``); of
    ``extras``, the embedding's with the first chunk of rank 0 and the logits with the last
    stage's chunk on its rank. Per distinct (schedule, pp, vpp, grad_accum): ``held (ranks x
    stages) @ kinds (stages x kinds) @ bytes (kinds x rows)``."""
    schedule, pp, vpp, grad_accum = columns
    extra, last_extra = extras
    kinds = tuple(sorted({*model.layer_kinds, model.mtp_layer_kind}))
    per_kind = np.stack([np.broadcast_to(kind_bytes(k), (len(pp),)) for k in kinds])
    unique, where = _distinct_rows(np.column_stack([schedule, pp, vpp, grad_accum]))
    if len(kinds) == 1:
        weights = [_one_kind_weights(model, *shape, kinds) for shape in unique.tolist()]
        return _one_kind_peak(weights, where, per_kind[0], (extra, last_extra))
    shapes = [_peak_weights(model, *shape, kinds) for shape in unique.tolist()]
    order = np.argsort(where, kind="stable")
    starts = np.searchsorted(where[order], np.arange(len(unique) + 1)).tolist()
    out = np.zeros(len(pp))
    for index, (stage_bytes, first, (rank, held_last), count) in enumerate(shapes):
        rows = order[starts[index] : starts[index + 1]]
        totals = stage_bytes @ per_kind[:, rows]
        totals[0] = totals[0] + extra[rows] * first
        totals[rank] = totals[rank] + last_extra[rows] * held_last
        out[rows] = totals.max(axis=0) / count
    return out


def _one_kind_peak(weights, where: np.ndarray, layer_bytes: np.ndarray, extras) -> np.ndarray:
    """``_scheduled_peak`` of a model with one layer kind, every row at once, to the loop's
    bit: ``(ranks x 1) @ (1 x rows)`` is each product alone, and a product is monotone in the
    rank's layers, so the ranks without an extra peak at the most layers (or the fewest, for
    negative bytes): rank 0 with the embedding's (and the logits' where the last stage is
    there), the last stage's rank with the logits, and that one (issue 23: 230 shapes of
    Llama-3 70B under torchtitan ``any``)."""
    extra, last_extra = extras
    table = np.array(weights, dtype=np.float64).reshape(-1, 8)
    first, held_first, last_rank, held_last, layers_last, most, fewest, count = table[where].T
    on_first = last_rank == 0
    rank0 = first * layer_bytes + extra * held_first
    rank0 = np.where(on_first, rank0 + last_extra * held_last, rank0)
    last = np.where(on_first, rank0, layers_last * layer_bytes + last_extra * held_last)
    others = np.where(layer_bytes >= 0, most * layer_bytes, fewest * layer_bytes)
    others = np.where(np.isnan(most), rank0, others)  # no rank without an extra
    return np.maximum(np.maximum(rank0, last), others) / count


@functools.lru_cache(maxsize=4096)
def _one_kind_weights(model: ModelSpec, code: int, p: int, v: int, m: int, kinds) -> tuple:
    """Of ``_peak_weights`` with one kind: rank 0's layers and its first chunk's micro-batches,
    the last stage's rank, its micro-batches of that chunk and its layers, the most and the
    fewest layers of the other ranks (NaN where there is none), the first rank's count.
    Memoised."""
    stage_bytes, held_first, (rank, held_last), count = _peak_weights(model, code, p, v, m, kinds)
    layers = stage_bytes[:, 0]
    rest = np.delete(layers, sorted({0, rank}))
    most, fewest = (float(rest.max()), float(rest.min())) if len(rest) else (np.nan, np.nan)
    return (layers[0], held_first, rank, held_last, layers[rank], most, fewest, count)


@functools.lru_cache(maxsize=4096)
def _peak_weights(model: ModelSpec, code: int, p: int, v: int, m: int, kinds: tuple[str, ...]):
    """Of one schedule's shape (``_scheduled_peak``): ``(ranks x kinds)`` layers a rank holds
    at its peak, the micro-batches of the first chunk of rank 0, the rank of the last stage's
    chunk and the micro-batches it holds of it, and the first rank's count in stages.
    Memoised; read only."""
    name = PIPELINE_SCHEDULES[code]
    held = in_flight_chunks(name, p, v, m)
    stage_bytes = _held_by_stage(name, p, v, m) @ _stage_kind_counts(model, p * v, kinds)
    stage_bytes.flags.writeable = False
    rank, chunk = chunk_of(name, p, v, p * v - 1)
    return stage_bytes, held[0][0], (rank, held[rank][chunk]), max(sum(held[0]) / v, 1e-30)


def _distinct_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, axis=0, return_inverse=True)`` for non-negative integer columns, through
    one mixed-radix key per row (the row-wise unique sorts a structured view, 5x slower)."""
    keys = np.asarray(keys, dtype=np.int64)
    radix = keys.max(axis=0) + 1 if len(keys) else np.ones(keys.shape[1], dtype=np.int64)
    assert float(np.prod(radix.astype(np.float64))) < 2.0**62, radix
    flat = np.ravel_multi_index(keys.T, tuple(int(r) for r in radix))
    _, first, where = np.unique(flat, return_index=True, return_inverse=True)
    return keys[first], where.ravel()


@functools.lru_cache(maxsize=4096)
def _held_by_stage(name: str, p: int, v: int, m: int) -> np.ndarray:
    """``(ranks x stages)``: micro-batches rank ``r`` holds of global stage ``s`` at its peak
    (``in_flight_chunks`` placed by ``chunk_stage``). Memoised; read only."""
    weights = np.zeros((p, p * v))
    for rank, chunks in enumerate(in_flight_chunks(name, p, v, m)):
        for chunk, count in enumerate(chunks):
            weights[rank, chunk_stage(name, p, v, rank, chunk)] += count
    weights.flags.writeable = False
    return weights


@functools.lru_cache(maxsize=256)
def _stage_kind_counts(model: ModelSpec, stages: int, kinds: tuple[str, ...]) -> np.ndarray:
    """``(stages x kinds)``: layers of each kind per stage (``all_stage_kinds``). Memoised;
    read only."""
    counts = np.array(
        [[stage.get(k, 0) for k in kinds] for stage in all_stage_kinds(model, stages)],
        dtype=np.float64,
    )
    counts.flags.writeable = False
    return counts


def first_stage_kind_counts(model: ModelSpec, pp: np.ndarray) -> dict[str, np.ndarray]:
    """Layer-kind counts of the first stage (it holds the most micro-batches in flight)."""
    pp = np.asarray(pp, dtype=np.int64)
    kinds = sorted(set(model.layer_kinds))
    out = {kind: np.zeros(len(pp)) for kind in kinds}
    for value in np.unique(pp):
        for kind, count in stage_kinds(model, int(value), 0).items():
            out[kind][pp == value] = count
    return out


def kind_total_params(model: ModelSpec, kind: str) -> int:
    """All parameters of one layer of ``kind``, routed experts included."""
    return kind_params(model, kind) + (expert_params(model) if kind.endswith("/moe") else 0)


def dense_block_params(model: ModelSpec) -> int:
    """Transformer-block parameters that TP x PP shard (everything but the routed experts and the
    embeddings), including the final norm and the MTP modules."""
    layers = sum(kind_params(model, kind) for kind in model.layer_kinds)
    mtp = model.num_mtp_layers * (
        kind_params(model, model.mtp_layer_kind) + mtp_extra_params(model)
    )
    return layers + mtp + norm_params(model)


def num_expert_layers(model: ModelSpec) -> int:
    """MoE layers including MTP layers of MoE kind."""
    mtp = model.num_mtp_layers if model.mtp_layer_kind.endswith("/moe") else 0
    return model.num_moe_layers + mtp


def total_params(model: ModelSpec, *, mtp: bool = True) -> int:
    """All parameters (unpadded vocabulary), for reports and tests; ``mtp=False`` leaves the MTP
    modules out (DeepSeek-V3's "671B main model")."""
    embedding = model.vocab_size * model.hidden_size
    output = 0 if model.tied_embeddings else embedding
    positions = (
        model.max_position_embeddings * model.hidden_size * int(model.learned_position_embeddings)
    )
    experts = num_expert_layers(model) * expert_params(model)
    total = dense_block_params(model) + experts + embedding + output + positions
    if not mtp and model.num_mtp_layers:
        layer = kind_params(model, model.mtp_layer_kind) + mtp_extra_params(model)
        moe = expert_params(model) if model.mtp_layer_kind.endswith("/moe") else 0
        total -= model.num_mtp_layers * (layer + moe)
    return total


def active_params(model: ModelSpec) -> int:
    """Parameters one token passes through (main model): routed experts count ``top_k`` times."""
    full = total_params(model, mtp=False)
    if not model.is_moe:
        return full
    per_expert = mlp_params(model, model.expert_ffn_hidden_size)
    unused = model.num_moe_layers * (model.num_experts - model.experts_per_token) * per_expert
    return full - unused
