"""The TP, CP and EP communication terms.

Collective times come from ``ctx.comm`` (``autopar.costs.comm.CollectiveModel``): the datasheet
alpha-beta model ``autopar.costs.comm.DatasheetCollectives`` by default, or a profile fitted from
nccl-tests logs (``autopar/calibration/``). Sizes follow the nccl-tests conventions of
``autopar.costs.comm``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.costs.terms import Grid, Phases, TermContext
from autopar.inputs.hardware import BLACKWELL_GENERATIONS
from cost_models import hybridep
from cost_models.compute import (
    backward_slowdown,
    flash_block_time_s,
    memory_time_s,
    mlp_time_s,
    moe_stage_layers,
    stage_counts_for_time,
)
from cost_models.flops import RECOMPUTE_FULL
from cost_models.gemm import OPERAND_BYTES, gemm_dtype
from cost_models.memory import without_unread
from cost_models.placement import group_num_nodes
from cost_models.shapes import kv_size, query_size, stage_layers
from cost_models.switches import switch

BYTES_BF16 = 2.0


def _axes(grid: Grid, *names: str) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(grid[name], dtype=np.float64) for name in names)


TP_OVERLAP_EXPOSED = 0.25
"""Share of TP collectives left exposed with Megatron ``--tp-comm-overlap`` (Transformer Engine
userbuffers pipeline the all-gather / reduce-scatter with the adjacent GEMM chunks; the first
and last chunks and the SM contention stay visible). A fixed engineering estimate, not fitted
(benchmarks/README.md lists it among the fixed constants); it moves only the rows that ran with
TP overlap (the 2024 Megatron README and NeMo 24.07 rows)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TpCommTime:
    """Tensor-parallel collectives of one stage, one micro-batch (Narayanan et al. 2021 §3.3;
    Korthikanti et al. 2022 §4.2.2). Per layer, on the activation tensor ``mbs*s/cp*h``: with SP
    one all-gather + reduce-scatter pair per TP-sharded sublayer (``tp_regions``: two in an
    attention + MLP layer) forward and the same backward; without SP one all-reduce each. Full
    recompute repeats the forward ones. Layers are those of the most loaded stage. TP ranks are
    consecutive, so the group spans ``ceil(tp / gpus_per_node)`` nodes: TP across nodes is
    allowed and priced at the network's bandwidth.

    With SP and an FP8 / FP4 GEMM after the all-gather, Transformer Engine quantizes before it
    gathers (``LayerNormLinear`` / ``Linear`` forward: the norm output is cast, then
    ``gather_along_first_dim(..., quantizer=input_quantizer)``; backward: the row-parallel
    layers' output gradient likewise, ``grad_output_preprocess`` with the gradient quantizer;
    transformer_engine/pytorch/module/layernorm_linear.py L278-313, linear.py L925-940), so the
    all-gathers move ``OPERAND_BYTES`` of that format per element while the reduce-scatters
    stay BF16. Current scaling (and NVFP4's per-tensor scale) first all-reduces the amax over
    the TP group (``set_quantizer_amax_reduction_group``, layernorm_linear.py L233-237): one
    latency-bound all-reduce per quantized all-gather.

    Without TP overlap, a stack with ``tp_backward_overlap`` (Transformer Engine, megatron-core)
    runs the column-parallel layers' backward all-gather and reduce-scatter (all-reduce without
    SP) async behind their dgrad / wgrad GEMMs; the backward exposes only the row-parallel
    layers' output-gradient all-gather (SP), nothing without SP."""

    name: str = "tp_comm_s"
    category: str = "tp_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute", "sp")
    overlap: bool | None = None
    """Megatron ``--tp-comm-overlap``: only ``TP_OVERLAP_EXPOSED`` of the time stays exposed;
    ``None``: as the stack says (``StackSpec.tp_comm_overlap``)."""

    def phases(self, grid: Grid, ctx: TermContext) -> Phases:
        tp, pp, cp, mbs = _axes(grid, "tp", "pp", "cp", "mbs")
        elements = mbs * ctx.training.seq_len / cp * ctx.model.hidden_size
        nodes = group_num_nodes(tp, 1.0, ctx.cluster.gpus_per_node)
        dtype = gemm_dtype(ctx, "fc1")
        ag = ctx.comm.time_s(
            "all_gather", elements * OPERAND_BYTES[dtype], num_ranks=tp, num_nodes=nodes
        )
        if dtype != "bf16" and amax_reduced(ctx):
            ag = ag + ctx.comm.time_s("all_reduce", AMAX_BYTES, num_ranks=tp, num_nodes=nodes)
        rs = ctx.comm.time_s("reduce_scatter", elements * BYTES_BF16, num_ranks=tp, num_nodes=nodes)
        ar = ctx.comm.time_s("all_reduce", elements * BYTES_BF16, num_ranks=tp, num_nodes=nodes)
        pair = np.where(grid["sp"] == 1, ag + rs, ar)
        recompute = np.where(grid["recompute"] == RECOMPUTE_FULL, 1.0, 0.0)
        counts = stage_counts_for_time(ctx.model, grid["pp"], ctx.training.seq_len)
        regions = sum(n * tp_regions(ctx.model, kind) for kind, n in counts.items())
        overlapped = switch(self.overlap, ctx, "tp_comm_overlap")
        exposed = TP_OVERLAP_EXPOSED if overlapped else 1.0
        one_way = exposed * regions * pair
        backward = one_way
        if not overlapped and ctx.training.stack.tp_backward_overlap:
            # only the row-parallel output gradient's all-gather waits (StackSpec docstring)
            backward = regions * np.where(grid["sp"] == 1, ag, 0.0)
        zero = np.zeros(len(tp))
        # forward's pair; backward's exposed part (and the recomputed forward's pair)
        return Phases(one_way, backward + one_way * recompute, zero, zero)

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        return self.phases(grid, ctx).total()


AMAX_BYTES = 4.0
"""One FP32 amax per quantized tensor, all-reduced (MAX) over the TP group before the cast."""


def amax_reduced(ctx: TermContext) -> bool:
    """Whether the stack's low-precision recipe needs a tensor-wide amax before casting: FP8
    current scaling and NVFP4 (its per-tensor FP32 scale); delayed scaling uses the previous
    step's amax, blockwise and MXFP8 scale per block."""
    return ctx.training.precision == "nvfp4" or ctx.training.stack.fp8_recipe == "current"


def tp_regions(model, kind: str) -> int:
    """TP-sharded sublayers of one layer (each an all-gather + reduce-scatter pair with SP, an
    all-reduce without): the token mixer, a dense MLP, an MoE layer's shared expert. Routed
    experts use the expert grid (``EpCommTime``)."""
    mixer, _, ffn = kind.partition("/")
    shared = ffn == "moe" and model.shared_expert_ffn_hidden_size > 0
    return int(mixer != "none") + int(ffn == "dense") + int(shared)


CP_STEP_OVERHEAD_S = 15e-6
"""Fixed cost of one ring step of context-parallel attention, per layer, forward (twice in
backward): each step launches its own flash-attention kernel on a sub-block, waits on the P2P
stream's event and rescales the partial output with the running log-sum-exp (Transformer Engine
``AttnFuncWithCPAndKVP2P`` loop, ~3 kernels and a stream sync: launch and sync latencies of 5 us
each on H100). Not fitted. With the small-block efficiency of the sub-blocks it is why CP loses
at short sequences."""


CP_UNBATCHED_EXCHANGE_S = 180e-6
"""Fixed cost of one K/V (or dK/dV) exchange of the P2P ring when Transformer Engine does not
batch its send and receive (``unbatched_ring``): ``flash_attn_p2p_communicate`` then issues an
``isend`` and an ``irecv`` as two NCCL operations in even/odd rank order (TE @d0067d0
``context_parallel.py`` L96-131), so each exchange is two rendezvous of the ring in sequence
instead of one grouped pair, ``cp - 1`` exchanges per layer forward and ``cp`` backward (the last
one returns dK/dV, L2460-2492). FITTED, one constant: the value that takes the mean signed error
of the two Blackwell calibration rows with CP (Llama 3.1 405B at CP 2: B200 FP8-CS 25.11 -5.0%,
GB300 MXFP8 26.06 -2.9%; both to within 0.4%) to zero (``benchmarks/README.md`` "mlperf_heldout").
It is a time per exchange, not per byte: on those rows and on the held-out MLPerf Llama 3.1 8B
runs the exchanges carry 4 to 17 MB, and the held-out 8B runs (CP 2 and CP 4, GB200 and GB300,
full-iteration CUDA graphs) miss the same ~0.2 ms per exchange that the calibration rows give.
The Hopper calibration rows with CP (all at CP 2, batched) need none."""


def unbatched_ring(cp: np.ndarray, ctx: TermContext) -> np.ndarray:
    """Whether Transformer Engine issues a ring step's send and receive as two NCCL operations
    (``context_parallel.py`` L1421-1423 forward, L2232-2234 backward, TE @d0067d0:
    ``batch_p2p_comm = NVTE_BATCH_MHA_P2P_COMM or (compute capability < 10.0 and cp == 2)``; the
    rule is in every release since v2.4, so in the NeMo 25.09+ containers the rows ran): on
    compute capability 10.x (``BLACKWELL_GENERATIONS``) it never batches them."""
    blackwell = ctx.cluster.gpu.generation in BLACKWELL_GENERATIONS
    return np.asarray(cp, dtype=np.float64) > (1.0 if blackwell else 2.0)


CP_CORRECTION_BYTES = 10.0
"""HBM bytes per output element per ring step for merging a block's partial attention output
into the running result: read the BF16 block output (2) and read-modify-write the FP32
accumulator (8) (Transformer Engine ``flash_attn_fwd_out_correction``); backward does the same
for dQ and for the dK/dV that travel with K and V (``AttnFuncWithCPAndKVP2P.backward``)."""


def _core_block_s(
    model,
    *,
    queries: np.ndarray,
    keys: np.ndarray,
    heads: np.ndarray,
    mbs: np.ndarray,
    causal,
    ctx: TermContext,
    backward: bool = False,
) -> np.ndarray:
    """Forward flash attention of one ``queries x keys`` block of ``heads`` heads, ``mbs``
    sequences: two GEMMs ``(q x d) @ (d x k)`` and ``(q x k) @ (k x d)``, half of each when the
    block is causal (on its diagonal); ``backward``: the pace the backward scales from."""
    one = flash_block_time_s(
        queries, keys, model.kv_channels, ctx=ctx, dtype="bf16", backward=backward
    )
    return mbs * heads * one * np.where(causal, 1.0, 2.0)


def ring_attention_s(
    model,
    *,
    tp: np.ndarray,
    cp: np.ndarray,
    mbs: np.ndarray,
    seq_len: int,
    ctx: TermContext,
    num_nodes: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) extra time of one layer's P2P ring attention over ``cp`` ranks, over
    the attention core that ``DenseComputeTime`` charges (Transformer Engine
    ``AttnFuncWithCPAndKVP2P``; Megatron ``--cp-comm-type p2p``).

    Load balancing: the sequence is cut into ``2*cp`` chunks of ``c = s/(2cp)`` tokens and rank
    ``i`` holds chunks ``i`` and ``2cp-1-i`` (Megatron ``get_batch_on_this_cp_rank``), so every
    ring step does the same work: step 0 the causal ``2c x 2c`` block, steps 1..cp-1 a full
    ``2c x c`` (or ``c x 2c``) block. While a block computes, the next rank's K and V (``2c``
    tokens of ``2*kv/tp`` BF16 elements) arrive; only a transfer longer than its block is
    exposed. Backward sends K, V and their gradients (twice the bytes) against blocks
    ``2*FLASH_BACKWARD_SLOWDOWN`` times as long. Each step costs ``CP_STEP_OVERHEAD_S`` and the
    merge of its partial output (``CP_CORRECTION_BYTES``), and the sub-blocks run at the (lower)
    efficiency of their smaller shapes."""
    heads = model.num_attention_heads / tp
    c = seq_len / (2.0 * cp)

    def blocks(backward: bool) -> tuple[np.ndarray, np.ndarray]:
        shape = dict(heads=heads, mbs=mbs, ctx=ctx, backward=backward)
        diagonal = _core_block_s(model, queries=2 * c, keys=2 * c, causal=True, **shape)
        block = _core_block_s(model, queries=2 * c, keys=c, causal=False, **shape)
        charged = _core_block_s(model, queries=seq_len / cp, keys=seq_len, causal=True, **shape)
        return block, np.maximum(diagonal + (cp - 1.0) * block - charged, 0.0)

    block, small_blocks = blocks(False)
    block_b, small_blocks_b = blocks(True)
    kv_bytes = mbs * 2.0 * c * 2.0 * kv_size(model) / tp * BYTES_BF16
    ranks = np.where(cp > 1, 2.0, 1.0)
    send = ctx.comm.time_s("send_recv", kv_bytes, num_ranks=ranks, num_nodes=num_nodes)
    backward_block = 2.0 * backward_slowdown(ctx) * block_b
    local = mbs * 2.0 * c
    merge_f = memory_time_s(CP_CORRECTION_BYTES * local * query_size(model) / tp, ctx)
    merge_b = memory_time_s(
        CP_CORRECTION_BYTES * local * (query_size(model) + 2 * kv_size(model)) / tp, ctx
    )
    forward = (cp - 1.0) * (np.maximum(send - block, 0.0) + CP_STEP_OVERHEAD_S + merge_f)
    backward = (cp - 1.0) * (
        np.maximum(2.0 * send - backward_block, 0.0) + 2 * CP_STEP_OVERHEAD_S + merge_b
    )
    unbatched = np.where(unbatched_ring(cp, ctx), CP_UNBATCHED_EXCHANGE_S, 0.0)
    forward = forward + (cp - 1.0) * unbatched
    backward = backward + cp * unbatched
    busy = cp > 1
    return (
        np.where(busy, forward + small_blocks, 0.0),
        np.where(busy, backward + 2.0 * backward_slowdown(ctx) * small_blocks_b, 0.0),
    )


def ulysses_s(
    model,
    *,
    tp: np.ndarray,
    a2a: np.ndarray,
    tokens: np.ndarray,
    ctx: TermContext,
    num_nodes: np.ndarray,
) -> np.ndarray:
    """Forward + backward time of one layer's all-to-all context parallelism over ``a2a`` ranks
    (DeepSpeed-Ulysses, Jacobs et al. 2023; Transformer Engine ``AttnFuncWithCPAndQKVOA2A``):
    Q, K, V are exchanged from sequence-sharded to head-sharded before the attention core and the
    output back after it; backward does the same with the gradients. Each rank sends its
    ``tokens`` of ``(q + 2kv)/tp`` and ``q/tp`` BF16 elements. Not overlapped."""
    q, kv = query_size(model), kv_size(model)
    qkv = ctx.comm.time_s(
        "all_to_all", tokens * (q + 2 * kv) / tp * BYTES_BF16, num_ranks=a2a, num_nodes=num_nodes
    )
    out = ctx.comm.time_s(
        "all_to_all", tokens * q / tp * BYTES_BF16, num_ranks=a2a, num_nodes=num_nodes
    )
    return 2.0 * (qkv + out)


def hierarchical_a2a_size(cp: np.ndarray, tp: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """The all-to-all part of ``a2a+p2p`` (Megatron ``--hierarchical-context-parallel-sizes``):
    the CP ranks inside one NVLink domain, ``min(cp, gpus_per_node / tp)``; the ring spans the
    rest."""
    return np.maximum(np.minimum(cp, np.floor(gpus_per_node / tp)), 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class CpCommTime:
    """Context parallelism of one stage, one micro-batch, per the stack's ``cp_comm_type``:
    ``p2p`` ring (``ring_attention_s``), ``a2a`` (``ulysses_s``) or ``a2a+p2p`` (all-to-all
    inside the node, ring across: ``hierarchical_a2a_size``). CP ranks are ``tp`` apart. Full
    recompute repeats the forward."""

    name: str = "cp_comm_s"
    category: str = "cp_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "mbs", "recompute")
    flash_attention: bool | None = None
    """Kept for compatibility: CP attention is always the fused (flash) kernel."""

    def phases(self, grid: Grid, ctx: TermContext) -> Phases:
        tp, pp, cp, mbs = _axes(grid, "tp", "pp", "cp", "mbs")
        model, s, node = ctx.model, ctx.training.seq_len, ctx.cluster.gpus_per_node
        kind = ctx.training.stack.cp_comm_type
        a2a = {"p2p": np.ones_like(cp), "a2a": cp}.get(kind)
        if a2a is None:
            a2a = hierarchical_a2a_size(cp, tp, node)
        ring = cp / a2a
        tokens = mbs * s / cp
        a2a_nodes = group_num_nodes(a2a, tp, node)
        ring_nodes = group_num_nodes(ring, tp * a2a, node)
        exchange = ulysses_s(model, tp=tp, a2a=a2a, tokens=tokens, ctx=ctx, num_nodes=a2a_nodes)
        ring_f, ring_b = ring_attention_s(
            model, tp=tp * a2a, cp=ring, mbs=mbs, seq_len=s, ctx=ctx, num_nodes=ring_nodes
        )
        recompute = np.where(grid["recompute"] == RECOMPUTE_FULL, 1.0, 0.0)
        forward = exchange / 2.0 + ring_f
        backward = forward * recompute + exchange / 2.0 + ring_b
        layers = stage_layers(model.num_layers, pp) * (cp > 1)
        zero = np.zeros(len(cp))
        return Phases(layers * forward, layers * backward, zero, zero)

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        return self.phases(grid, ctx).total()


EP_OVERLAP_EXPOSED = 0.2
"""Share of the expert all-to-alls a paired step leaves exposed (Megatron's combined 1F1B hides
one micro-batch's dispatch and combine behind another's attention and expert GEMMs,
combined_1f1b.py L51-63; DeepSeek-V3 report §3.2.1; SM contention and the layers' first and
last all-to-alls stay visible). Not fitted: the share of ``DP_OVERLAP_EXPOSED``."""


HOST_BOUND_PAIRS = "none"
"""The ``StackSpec.cuda_graphs`` scope under which the combined 1F1B hides no all-to-all: with
no CUDA graphs one host thread issues both micro-batches' kernels of a layer pair, split into
a dozen sub-module nodes alternating between the compute and communication streams
(``model_chunk_schedule_plan.py`` ``TransformerLayerSchedulePlan.run`` L176-239, Megatron-LM
@0d8e0714, the core of Megatron-Bridge v0.2.0), so the GPU waits for launches instead of
running one half under the other's all-to-all. Megatron-Bridge measured it and turned the
overlap off: "Disable ``moe_a2a_overlap`` due to CPU overhead for BF16 and MXFP8" (PR #1760,
Qwen3-235B on 64 B200: MXFP8 step 20.1 s -> 16.9 s, BF16 17.2 s -> 16.0 s; the 25.11 row of
``blackwell_recipes.csv`` is the 20.1 s run), and on B300 "moe_a2a_overlap and VP degraded
perf" (issue #3399). With ``layers`` or ``full`` graphs the attention, router and dispatch
preprocessing replay from graphs and the overlap is priced (``EP_OVERLAP_EXPOSED``). Not
fitted: the paired step then costs what the plain one does (the schedule's slots stay), which
leaves what the host costs beyond that unpriced (the PR's 20.1 / 16.9 includes dropping VP).
Hopper agrees: the H100 Qwen3-235B calibration rows ran ``moe_a2a_overlap`` without graphs
(v0.4.0 / v0.5.0 ``QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_*_V1``, which V2 inherits) and are
within -0.2..+7.3% priced without the overlap; with it hiding 80% they would be -17..-22%."""


DISPATCHERS: tuple[str, ...] = ("alltoall", "allgather", "flex")
"""Megatron ``--moe-token-dispatcher-type`` (``moe/token_dispatcher.py``; ``flex`` is DeepEP /
HybridEP). Not a layout axis: searched as one it tripled the MoE space (Mixtral-8x22B on 4096
GPUs: 1.8 s to a proven optimum became 10 s without proof); ``"best"`` prices the fastest."""


def dispatch_time_s(grid: Grid, ctx: TermContext, dispatcher: str) -> np.ndarray:
    """One dispatch (forward) of one MoE layer on one rank, ``mbs*s/(tp*cp)`` tokens of ``h``
    BF16 elements each (Megatron ``moe/token_dispatcher.py``):

    - ``alltoall`` (``MoEAlltoAllTokenDispatcher``): an all-to-all of the ``top_k`` routed copies
      over EP (ranks ``etp`` apart), then an all-gather of what arrived over ETP;
    - ``allgather`` (``MoEAllGatherTokenDispatcher``): all tokens all-gathered over ETP x EP;
    - ``flex`` (``MoEFlexTokenDispatcher``, DeepEP): the all-to-all sends a token once per
      destination node over the network and fans out over NVLink, so the inter-node bytes scale
      with the distinct nodes a token reaches: ``n * (1 - (1 - 1/n)^top_k)`` of ``n`` nodes for
      uniform routing, at most ``topk_group`` with node-limited routing
      (``moe_utils.group_limited_topk``; DeepSeek-V3 report §2.1.2: "each token will be sent to
      at most M nodes"). Inside one NVLink 5 domain (Blackwell) HybridEP's published pace per
      received row (``cost_models.hybridep``: one row per destination rank, the Torch API's
      figures, the kernels' under full-iteration graphs) replaces the datasheet all-to-all.
    The combine mirrors it (reduce-scatter over ETP, all-to-all back)."""
    model = ctx.model
    tp, cp, ep, etp, mbs = (
        np.asarray(grid[a], dtype=np.float64) for a in ("tp", "cp", "ep", "etp", "mbs")
    )
    gpn = ctx.cluster.gpus_per_node
    tokens = mbs * ctx.training.seq_len / (tp * cp)
    token_bytes = model.hidden_size * BYTES_BF16
    copies = tokens * model.experts_per_token
    etp_nodes = group_num_nodes(etp, 1.0, gpn)
    if dispatcher == "allgather":
        group = ep * etp
        size = group * tokens * token_bytes
        nodes = group_num_nodes(group, 1.0, gpn)
        return ctx.comm.time_s("all_gather", size, num_ranks=group, num_nodes=nodes)
    nodes = group_num_nodes(ep, etp, gpn)
    size = copies * token_bytes
    if dispatcher == "flex":
        # distinct nodes among top-k uniformly routed experts: n * (1 - (1 - 1/n)^k)
        reach = nodes * (1.0 - (1.0 - 1.0 / nodes) ** model.experts_per_token)
        if model.moe_router_group_topk:
            reach = np.minimum(reach, model.moe_router_group_topk)
        size = size * np.where(nodes > 1.0, reach / model.experts_per_token, 1.0)
    a2a = ctx.comm.time_s("all_to_all", size, num_ranks=ep, num_nodes=nodes)
    if dispatcher == "flex" and hybridep.applies(ctx):
        # HybridEP's measured pace inside one NVLink 5 domain (``cost_models.hybridep``)
        one_domain = (nodes <= 1.0) & (etp <= 1.0)
        a2a = np.where(one_domain, hybridep.hybridep_one_way_s(grid, ctx, tokens), a2a)
    gathered = etp * copies * token_bytes
    gather = ctx.comm.time_s("all_gather", gathered, num_ranks=etp, num_nodes=etp_nodes)
    return a2a + gather


def _candidates(ctx: TermContext, dispatcher: str | None) -> tuple[str, ...]:
    """The dispatchers to choose from: one named, all of ``DISPATCHERS`` (``"best"``), or the
    stack's allowed ones (``None``: ``StackSpec.moe_dispatchers``)."""
    if dispatcher is None:
        return ctx.training.stack.moe_dispatchers
    return DISPATCHERS if dispatcher == "best" else (dispatcher,)


COMBINED = PIPELINE_SCHEDULES.index("combined-1f1b")
COMBINED_DISPATCHERS = ("alltoall", "flex")
"""The dispatchers Megatron's combined 1F1B runs with (transformer_config.py L3016-3019)."""


def _dispatch_times(grid: Grid, ctx: TermContext, dispatcher: str | None):
    """Each candidate's ``dispatch_time_s`` (``_candidates``), ``inf`` where the layout's schedule
    cannot use it (the combined 1F1B: ``COMBINED_DISPATCHERS``; rows without a schedule column
    take any)."""
    names = _candidates(ctx, dispatcher)
    times = np.array([dispatch_time_s(grid, ctx, name) for name in names], dtype=np.float64)
    if "schedule" in grid:
        combined = np.asarray(grid["schedule"]) == COMBINED
        for i, name in enumerate(names):
            if name not in COMBINED_DISPATCHERS:
                times[i] = np.where(combined, np.inf, times[i])
    return names, times


def dispatcher_time_s(grid: Grid, ctx: TermContext, dispatcher: str | None) -> np.ndarray:
    """``dispatch_time_s`` of the fastest candidate dispatcher for each layout (``_candidates``).
    Only this term depends on the dispatcher, so the minimum here is the choice a search over
    it would make, without an axis that would triple the MoE tables; ``best_dispatcher`` names
    the choice for the report and the launch configs."""
    return np.min(_dispatch_times(grid, ctx, dispatcher)[1], axis=0)


def best_dispatcher(grid: Grid, ctx: TermContext, dispatcher: str | None = "best") -> list[str]:
    """The fastest candidate dispatcher of each layout (``--moe-token-dispatcher-type``)."""
    names, times = _dispatch_times(grid, ctx, dispatcher)
    return [names[i] for i in np.argmin(times, axis=0)]


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatcherDecision:
    """The ``decisions`` of the default cost model: the token dispatcher ``EpCommTime`` priced
    for each layout of an MoE model (nothing for a dense one)."""

    dispatcher: str | None = None

    def decide(self, grid: Grid, ctx: TermContext) -> dict[str, list[str]]:
        if not ctx.model.is_moe:
            return {}
        return {"moe_token_dispatcher": best_dispatcher(grid, ctx, self.dispatcher)}


def routed_copy_exposure(
    grid: Grid, ctx: TermContext, dispatcher: str | None, ep_overlap: bool | None
) -> np.ndarray:
    """Share of the routed-copy bytes (``compute.ROUTED_COPY_BYTES``) left on the compute stream.

    With the ``flex`` (HybridEP) dispatcher the token permutation and the weighted
    unpermutation run inside the dispatch and combine kernels, on the communication stream
    (Megatron-LM @d98e8a64 ``moe/fused_a2a.py``: ``HybridEPDispatch`` L358-361 "permute +
    dispatch a2a + permute", ``dispatch_with_permute`` L425; ``HybridEPCombine`` L479-482,
    ``combine_with_unpermute`` L489). ``--overlap-moe-expert-parallel-comm`` overlaps that
    stream with the other micro-batch's compute, so those bytes are hidden like the all-to-all:
    ``EP_OVERLAP_EXPOSED`` of them stay.

    Only when the dispatch does not wait on the host: HybridEP sizes its output from the
    per-expert counts with a device-to-host sync unless it is given a static budget of
    permuted tokens (``token_dispatcher.py`` L1100-1112, ``moe_expert_rank_capacity_factor``;
    ``fused_a2a.py`` L415-417 ``non_blocking = num_permuted_tokens is not None``). Full-iteration
    CUDA graphs need that static budget (Megatron-Bridge ``perf_recipes/qwen/common.py``
    ``_enable_hybridep_full_iteration_mxfp8`` sets 1.5), so ``cuda_graphs == "full"`` is the
    condition. With the ``alltoall`` / ``allgather`` dispatchers Megatron permutes in
    ``moe_utils.permute`` on the compute stream: all of the bytes stay."""
    ones = np.ones(len(grid["tp"]))
    overlap = switch(ep_overlap, ctx, "ep_comm_overlap")
    if not (overlap and ctx.training.stack.cuda_graphs == "full"):
        return ones
    flex = np.asarray(best_dispatcher(grid, ctx, dispatcher)) == "flex"
    return np.where(flex, EP_OVERLAP_EXPOSED, ones)


@dataclass(frozen=True, slots=True, kw_only=True)
class EpCommTime:
    """Expert-parallel and expert-tensor-parallel communication of the MoE layers of the most
    loaded stage, one micro-batch: dispatch and combine forward (``dispatch_time_s``), the same
    backward, and again forward under full recompute. EP across nodes is allowed and priced
    (the all-to-all's inter-node part runs at the NIC rate, ``DatasheetCollectives``).

    ``shared_expert_overlap`` (Megatron ``--moe-shared-expert-overlap``,
    ``moe/shared_experts.py``) runs the shared expert on a side stream during the dispatch and
    combine, hiding up to its compute time. A schedule that pairs one micro-batch's forward
    with another's backward (Megatron's combined 1F1B, ``--overlap-moe-expert-parallel-comm``)
    hides all but ``EP_OVERLAP_EXPOSED`` of both all-to-alls in each pair
    (``Phases.paired_hidden``; the slots count the pairs on the critical path, so the warm-up
    and cool-down, which run unpaired, keep theirs), unless no CUDA graphs cut the host's
    launches (``HOST_BOUND_PAIRS``: then the pairs hide nothing)."""

    name: str = "ep_comm_s"
    category: str = "ep_comm"
    depends_on: tuple[str, ...] = ("tp", "pp", "cp", "ep", "etp", "mbs", "recompute", "schedule")
    dispatcher: str | None = None
    """One of ``DISPATCHERS``, ``"best"`` (the fastest of all), or ``None``: the fastest the
    stack allows (``StackSpec.moe_dispatchers``)."""
    shared_expert_overlap: bool = False
    ep_overlap: bool | None = None
    """``False``: the pairs hide nothing (``None``, ``True``: as above)."""

    def __post_init__(self) -> None:
        assert self.dispatcher in (*DISPATCHERS, "best", None), self.dispatcher

    def depends_on_in(self, domains) -> tuple[str, ...]:
        """Without ``schedule`` in a space without the combined 1F1B (the only schedule that
        narrows the dispatchers: ``_dispatch_times``)."""
        return without_unread(self.depends_on, domains, ("schedule",), ("combined-1f1b",))

    def evaluate(self, grid: Grid, ctx: TermContext) -> np.ndarray:
        return self.phases(grid, ctx).total()

    def phases(self, grid: Grid, ctx: TermContext) -> Phases:
        model = ctx.model
        if not model.is_moe:
            zero = np.zeros(len(grid["tp"]))
            return Phases(zero, zero, zero, zero)
        one_way = dispatcher_time_s(grid, ctx, self.dispatcher)
        forward = 2.0 * one_way
        backward = 2.0 * one_way
        if self.shared_expert_overlap and model.shared_expert_ffn_hidden_size:
            tp, cp, mbs = (np.asarray(grid[a], dtype=np.float64) for a in ("tp", "cp", "mbs"))
            sf, sb, _ = mlp_time_s(
                model,
                model.shared_expert_ffn_hidden_size,
                tokens=mbs * ctx.training.seq_len / cp,
                tp=tp,
                ctx=ctx,
            )
            forward = np.maximum(forward - sf, 0.0)
            backward = np.maximum(backward - sb, 0.0)
        full = np.asarray(grid["recompute"]) == RECOMPUTE_FULL
        layers = moe_stage_layers(stage_counts_for_time(model, grid["pp"], ctx.training.seq_len))
        hidden = 0.0 if self.ep_overlap is False else 1.0 - EP_OVERLAP_EXPOSED
        if ctx.training.stack.cuda_graphs == HOST_BOUND_PAIRS:
            hidden = 0.0  # the host cannot feed the paired layers (``HOST_BOUND_PAIRS``)
        # only the combined 1F1B overlaps a pair's halves layer by layer; torchtitan's DualPipeV
        # runs them one after the other (schedule.SEQUENTIAL_PAIRS), hiding nothing
        overlapped = np.asarray(grid["schedule"]) == COMBINED if "schedule" in grid else False
        hidden = np.where(overlapped, hidden, 0.0)
        return Phases(
            layers * forward,
            layers * (backward + full * forward),
            np.zeros(len(grid["tp"])),
            layers * hidden * (forward + backward),
        )
