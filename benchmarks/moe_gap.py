"""Where the MoE rows' error sits, per layer and micro-batch (issue 20, benchmarks/README.md
"Blackwell", known misses).

    python benchmarks/moe_gap.py [substring ...]

For each Megatron-Bridge MoE row (H100 and Blackwell; the ids that contain one of the
substrings, default GPT-OSS 120B), prints the measured minus the predicted step time divided by
the micro-batches and the layers of the critical stage (ms per layer and micro-batch: a cost that
does not shrink with the GPU shows as the same figure on every row, one that scales with the work
as a figure that follows the components beside it), and the model's own per-layer pieces at the
row's layout: the routed experts' grouped GEMMs (forward + backward, ``ExpertComputeTime``), the
unfused expert path (``expert_path_s``), the attention core (mean of a full and a windowed layer,
forward + backward, ``attention_core_time_s``) and the four dispatches of one layer
(``dispatch_time_s``, before any overlap). Nothing is fitted or changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_published as vp  # noqa: E402

import cost_models.attention as attention  # noqa: E402
import cost_models.compute as compute  # noqa: E402
from autopar.costs.comm import DatasheetCollectives  # noqa: E402
from autopar.costs.terms import TermContext, grid_of  # noqa: E402
from autopar.inputs.specs import ClusterSpec, SearchOptions  # noqa: E402
from cost_models.communication import dispatch_time_s  # noqa: E402
from cost_models.flops import attention_keys  # noqa: E402

DEFAULT_MATCH = ("gpt_oss", "gptoss")
MS = 1e3


def _context(case: vp.Case) -> TermContext:
    cluster = ClusterSpec(gpu=case.gpu, gpus_per_node=case.gpu.gpus_per_node)
    return TermContext(
        model=case.model,
        cluster=cluster,
        training=case.training,
        options=SearchOptions(),
        comm=DatasheetCollectives(cluster),
    )


def _attention_core_s(case: vp.Case, ctx: TermContext, tokens: np.ndarray) -> float:
    """Forward + backward attention core of one layer, the mean over the model's mixer kinds
    (full and sliding-window layers alternate in GPT-OSS)."""
    model, s, lay = case.model, case.training.seq_len, case.layout
    mixers = ("attention", "sliding") if model.attention_window else ("attention",)
    times = []
    for mixer in mixers:
        keys = attention_keys(model, mixer, s)
        if mixer == "sliding" and keys < s:
            keys = attention.windowed_keys(keys, s)
        shape = dict(tokens=tokens, seq_len=keys, tp=np.array([float(lay.tp)]), ctx=ctx)
        shape["mbs"] = np.array([float(lay.mbs)])
        forward = attention.attention_core_time_s(model, flash_attention=True, **shape)
        paced = attention.attention_core_time_s(model, flash_attention=True, backward=True, **shape)
        times.append(float((forward + 2.0 * attention.backward_slowdown(ctx) * paced)[0]))
    return float(np.mean(times))


def gap_row(case: vp.Case) -> dict[str, object]:
    """The row's gap and the model's per-layer pieces, in ms per layer and micro-batch."""
    ctx, model, lay = _context(case), case.model, case.layout
    grid = grid_of([lay])
    tokens = np.array([lay.mbs * case.training.seq_len / (lay.tp * lay.cp)])
    per_expert = tokens * model.experts_per_token * lay.ep * lay.etp / model.num_experts
    etp = np.array([float(lay.etp)])
    f, b, _ = compute.mlp_time_s(
        model, model.expert_ffn_hidden_size, tokens=per_expert, tp=etp, ctx=ctx
    )
    local = model.num_experts / lay.ep / compute.GROUPED_GEMM_EFFICIENCY
    path_f, path_b = compute.expert_path_s(
        ctx, rows=per_expert * model.num_experts / lay.ep, etp=etp
    )
    dispatcher = case.cost_switches.get("moe_dispatcher") or "alltoall"
    predicted = vp.predict(case)["predicted_s"]
    layers = model.num_layers / lay.pp
    return {
        "id": case.row_id,
        "gpu": case.gpu.name,
        "ep": lay.ep,
        "mbs": lay.mbs,
        "error_pct": round(100.0 * (predicted / case.measured_step_s - 1.0), 1),
        "gap_ms": round(MS * (case.measured_step_s - predicted) / lay.grad_accum / layers, 2),
        "expert_gemm_ms": round(MS * float((local * (f + b))[0]), 2),
        "expert_path_ms": round(MS * float((path_f + path_b)[0]), 2),
        "attention_core_ms": round(MS * _attention_core_s(case, ctx, tokens), 2),
        "dispatch_ms": round(MS * 4.0 * float(dispatch_time_s(grid, ctx, dispatcher)[0]), 2),
    }


def main(argv: list[str]) -> None:
    match = tuple(argv) or DEFAULT_MATCH
    runs = pd.read_csv(vp.DEFAULT_CSV)
    rows = []
    for _, row in runs.iterrows():
        if not any(m in str(row["id"]) for m in match):
            continue
        case = vp.build_case(row, runs)
        if isinstance(case, str) or not case.model.is_moe:
            continue
        rows.append(gap_row(case))
    print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
