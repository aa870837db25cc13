"""HybridEP's dispatch and combine inside one NVLink 5 domain, priced from its published figures
(``communication.dispatch_time_s`` uses them for the ``flex`` dispatcher on Blackwell when the
EP group does not leave the domain).

HybridEP (DeepEP ``hybrid-ep`` branch @94a9f8f, the backend Megatron-Bridge's ``hybridep``
flex dispatcher runs, Megatron-LM ``moe/fused_a2a.py``) sends each token once to every rank
that holds one of its experts and permutes it to the experts there (``is_token_in_rank``), so a
rank receives ``tokens * ep * P(hit)`` rows, ``P(hit) = 1 - C(E - E/ep, k) / C(E, k)`` for
``top_k = k`` of ``E`` experts routed uniformly (the published benchmarks force balanced
routing), fewer than the ``tokens * k`` copies of the ``alltoall`` dispatcher when a rank holds
several experts (GPT-OSS at EP 8: 3.3 ranks per token against 4 copies; Qwen3 at EP 8: 5.3
against 8).

Its benchmark (``tests/test_hybrid_ep.py`` ``test_hybrid_ep_benchmark``: bandwidth =
``dispatched_hidden.numel() * 2 / t``, the received rows in BF16) reports that per rank and
second (``docs/README_Hybrid-EP.md``, GB200, 4,096 tokens, hidden 7,168, top-8, 16 SMs, the
SMs Megatron-Bridge's recipes give it: ``moe_hybridep_num_sms = 16``,
``recipes/gpt_oss/gpt_oss.py`` L198 at v0.4.0): through the Torch API (dispatch kernel + copies +
the device sync Megatron pays whenever the permuted size is not static, ``fused_a2a.py``
L415-417) and for the kernels alone (what a static budget under full-iteration CUDA graphs
leaves, ``communication.routed_copy_exposure``). The B200 table (8 ranks: 535.94 / 530.86 Torch
API, 734.95 / 673.84 kernels) is within 3% of GB200's at 8. Measured, not fitted.
"""

from __future__ import annotations

from math import comb

import numpy as np

from autopar.costs.terms import Grid, TermContext
from autopar.inputs.hardware import BLACKWELL_GENERATIONS

HYBRIDEP_GB_PER_S: dict[int, tuple[float, float, float, float]] = {
    8: (550.10, 538.44, 750.15, 684.27),
    16: (472.84, 474.48, 661.93, 600.75),
    24: (441.89, 444.40, 637.80, 565.53),
    32: (485.50, 423.19, 629.79, 547.25),
    36: (469.96, 418.27, 612.85, 543.27),
}
"""EP ranks -> BF16 dispatch and combine GB/s per rank through the Torch API, then the same for
the kernels alone (``docs/README_Hybrid-EP.md`` "GB200 Platform", 16 SMs). Above 36 ranks (EP 64
on an NVL72) the 36-rank figures; below 8, the 8-rank ones."""


def rank_hit_probability(num_experts: int, top_k: int, ep: float) -> float:
    """Probability that a uniformly routed token has at least one of its ``top_k`` experts on a
    given rank of ``ep`` holding ``num_experts / ep`` each (drawn without replacement); 1 for
    a single rank."""
    local = min(num_experts, int(round(num_experts / max(ep, 1.0))))
    return 1.0 - comb(num_experts - local, top_k) / comb(num_experts, top_k)


def _figures(ep: float) -> tuple[float, float, float, float]:
    for ranks in sorted(HYBRIDEP_GB_PER_S):
        if ep <= ranks:
            return HYBRIDEP_GB_PER_S[ranks]
    return HYBRIDEP_GB_PER_S[max(HYBRIDEP_GB_PER_S)]


def applies(ctx: TermContext) -> bool:
    """Whether the figures describe this GPU's NVLink domain: NVLink 5, measured on B200 and
    GB200 (Blackwell Ultra keeps NVLink 5: ``BLACKWELL_GENERATIONS``)."""
    return ctx.model.is_moe and ctx.cluster.gpu.generation in BLACKWELL_GENERATIONS


def hybridep_one_way_s(grid: Grid, ctx: TermContext, tokens: np.ndarray) -> np.ndarray:
    """Mean of one dispatch and one combine of ``tokens`` per rank over EP inside one NVLink
    domain (``EpCommTime`` charges dispatch + combine as twice this); zero without EP."""
    model = ctx.model
    ep = np.asarray(grid["ep"], dtype=np.float64)
    sizes, where = np.unique(ep, return_inverse=True)  # a few EP sizes over a whole grid
    hit = np.array(
        [rank_hit_probability(model.num_experts, model.experts_per_token, e) for e in sizes]
    )[where]
    figures = np.array([_figures(e) for e in sizes])[where]
    dispatch, combine = (
        (figures[:, 2], figures[:, 3])
        if ctx.training.stack.cuda_graphs == "full"
        else (figures[:, 0], figures[:, 1])
    )
    received_bytes = np.asarray(tokens, dtype=np.float64) * ep * hit * model.hidden_size * 2.0
    one_way = 0.5 * received_bytes * (1.0 / dispatch + 1.0 / combine) / 1e9
    return np.where(ep > 1.0, one_way, 0.0)
