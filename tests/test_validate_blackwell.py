"""The 44 Megatron-Bridge Blackwell rows (issue 20; data README section 19): each is modelled on
its GPU preset with the recipe it ran (``benchmarks/published_blackwell.py``), every published
layout fits, and the errors stay where benchmarks/README.md "Blackwell" reports them. Where the
issue's targets (median <= 6%, max <= 20%, signed median within +-3% per GPU) hold, they are
asserted; where they do not (the MoE families the model misses, GPT-OSS above all), the bound
is today's figure, so that a change that makes them worse fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.validation import validate_published, validated

pytestmark = pytest.mark.xdist_group("validation")  # one worker validates (conftest)

KNOWN_MISS = validate_published.KNOWN_MISS


@pytest.fixture(scope="module")
def blackwell():
    modelled, skipped = validated()
    return modelled[modelled["source"] == "mbridge_blackwell"], skipped


def _stats(rows) -> tuple[float, float, float]:
    errors = rows["error_pct"].to_numpy()
    return float(np.median(np.abs(errors))), float(np.abs(errors).max()), float(np.median(errors))


def test_every_blackwell_row_is_modelled_or_skipped_with_a_reason(blackwell) -> None:
    modelled, skipped = blackwell
    runs = validate_published.pd.read_csv(validate_published.DEFAULT_CSV)
    ids = {r["id"] for _, r in runs.iterrows() if validate_published.is_blackwell_row(r)}
    assert len(ids) == 44
    skipped_here = skipped[skipped["id"].isin(ids)]
    assert set(modelled["id"]) | set(skipped_here["id"]) == ids
    assert len(skipped_here) == 1 and "contradict" in skipped_here["reason"].iloc[0]
    assert set(modelled["gpu"]) == {"b200", "b300", "gb200-nvl72", "gb300-nvl72"}
    assert set(modelled["precision"]) == {"bf16", "fp8", "nvfp4"}


def test_every_published_blackwell_layout_fits(blackwell) -> None:
    """Megatron-FSDP with CPU offloading (Llama 3.1 405B at TP 2 on GB200), GPT-OSS 120B at EP 8
    on B200 (recompute of norms and the experts' activation), DeepSeek-V3 on every SKU."""
    modelled = blackwell[0]
    assert modelled["fits"].all(), modelled[~modelled["fits"]]["id"].tolist()


def test_dense_blackwell_rows_meet_the_targets(blackwell) -> None:
    dense = blackwell[0][~blackwell[0]["moe"]]
    median, worst, signed = _stats(dense)
    assert median <= 6.0 and abs(signed) <= 3.0
    assert worst <= 20.0  # Llama 3.1 405B NVFP4 on GB200, +17.5% (benchmarks/README.md)
    for gpu, rows in dense.groupby("gpu"):
        assert abs(_stats(rows)[2]) <= 3.0, gpu


def test_blackwell_rows_per_gpu_kind(blackwell) -> None:
    """The signed median per GPU: within +-3% on B300 (its efficiency is fitted on its five MoE
    rows), GB200 and GB300; B200 carries the 26.04.01 GPT-OSS row and the 25.11 Qwen3-235B row,
    the known misses (-4.1%)."""
    for gpu, rows in blackwell[0].groupby("gpu"):
        median, _, signed = _stats(rows)
        assert abs(signed) <= (4.5 if gpu == "b200" else 3.0), gpu
        # B300's median |error| is the third of its five rows, Qwen3-235B MXFP8 (+13.8% since
        # BLACKWELL_BF16_GEMM_SLOWDOWN, +12.0% before; its two GPT-OSS rows -17% / -15% above it).
        assert median <= (14.0 if gpu == "b300" else 7.0), gpu
        without = rows[rows["model"] != KNOWN_MISS]  # B300: +12% over its other three rows
        assert abs(_stats(without)[2]) <= (12.5 if gpu == "b300" else 7.0), gpu


def test_all_blackwell_rows_stay_where_the_readme_reports_them(blackwell) -> None:
    modelled = blackwell[0]
    median, worst, signed = _stats(modelled)
    # worst 24.3% before GPT-OSS's unfused YaRN RoPE and HybridEP's measured pace
    assert median <= 5.0 and abs(signed) <= 3.0 and worst <= 22.5
    median, worst, _ = _stats(modelled[modelled["model"] != KNOWN_MISS])
    # the B200 25.11 Qwen3-235B row, -19.5% once its EP overlap without graphs hides nothing
    # (communication.HOST_BOUND_PAIRS; -27.4% priced as hiding 80%)
    assert median <= 6.0 and worst <= 20.0


def test_gpt_oss_is_the_family_the_model_misses(blackwell) -> None:
    """GPT-OSS rows are predicted too fast on every Blackwell SKU (all but the two BF16 rows at
    EP 64, within 1% since BF16 GEMMs run ``BLACKWELL_BF16_GEMM_SLOWDOWN`` slower):
    printed apart by validate_published.py, kept in the error bands. The H100 rows (PP 4, one
    sequence per micro-batch) are within 4% since the clamped GLU and the eager expert bias are
    priced: the Blackwell misses are not those passes."""
    rows = blackwell[0][blackwell[0]["model"] == KNOWN_MISS]
    assert len(rows) == 8 and (rows["error_pct"] < 1.0).all()
    assert (rows["error_pct"] < 0).sum() >= 6 and rows["error_pct"].median() < -5.0


def test_the_gpt_oss_rows_with_fp8_attention_pay_the_unwindowed_backward(blackwell) -> None:
    """The 26.08 GPT-OSS recipes run the attention in MXFP8, whose cuDNN backward on Blackwell
    computes the whole causal triangle of a sliding-window layer (``attention.
    FP8_UNWINDOWED_BACKWARD``): priced so, they are within 12% (-18% / -21% when the window was
    skipped), still too fast, as the BF16-attention rows are."""
    rows = blackwell[0][blackwell[0]["id"].str.contains("2608_gb[23]00_gptoss", regex=True)]
    assert len(rows) == 2
    assert (rows["error_pct"] < 0).all() and (rows["error_pct"] > -12.0).all()


def test_the_tp_backward_of_the_nvfp4_rows_overlaps_without_userbuffers(blackwell) -> None:
    """The NVFP4 recipes turn TP overlap off; Transformer Engine still runs the column-parallel
    backward all-gather and reduce-scatter behind the GEMMs (``tp_backward_overlap``): the two
    TP 4 Llama 3.1 405B rows expose less TP time than the forward and backward pairs would."""
    rows = blackwell[0][blackwell[0]["id"].str.contains("llama31_405b_nvfp4")]
    assert len(rows) == 2
    assert (rows["tp_comm_s"] < 0.75 * 5.14).all()  # 5.14 s with the whole backward pair
    assert (rows["error_pct"].abs() <= 20.0).all()


def test_the_mlperf_heldout_runs_are_all_modelled() -> None:
    """``benchmarks/mlperf_heldout.py`` (held out, not calibration): its 23 MLPerf Training v5.1
    runs (NVIDIA's GB200 / GB300, four other submitters' B200 and B300) build from their
    config's layout, fit in memory and get a finite prediction."""
    rows = _heldout().heldout_table()
    assert len(rows) == 23
    assert all(r["fits"] and np.isfinite(r["error_pct"]) for r in rows)
    assert {r["id"].split("_")[1] for r in rows} == {"b200", "b300", "gb200", "gb300"}


def _heldout():
    script = Path(validate_published.__file__).with_name("mlperf_heldout.py")
    spec = importlib.util.spec_from_file_location("mlperf_heldout", script)
    heldout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(heldout)
    return heldout


def test_a_strong_scaled_blackwell_cp_step_carries_every_ring_exchange() -> None:
    """The 512-GPU MLPerf 8B step (TP 2, CP 4, one micro-batch of 32 layers on GB300): its CP
    time holds the fixed cost of each unbatched exchange, 3 forward and 4 backward per layer,
    which does not shrink with the 1,024 tokens per GPU (``CP_UNBATCHED_EXCHANGE_S``)."""
    from cost_models.communication import CP_UNBATCHED_EXCHANGE_S

    case = next(c for c in _heldout().heldout_cases() if c.row_id.endswith("gb300_llama31_8b_512"))
    assert (case.layout.cp, case.layout.grad_accum, case.layout.pp) == (4, 1, 1)
    cp_comm_s = validate_published.predict(case)["cp_comm_s"]
    assert cp_comm_s >= 32 * (2 * 4 - 1) * CP_UNBATCHED_EXCHANGE_S


def test_a_recipe_without_a_flex_backend_runs_the_alltoall_dispatcher(blackwell) -> None:
    """GPT-OSS 120B on B200 in 25.11 ran EP 64 over eight DGX nodes with Megatron's alltoall
    dispatcher (its v0.2.0 workload config names no flex backend; ``blackwell_recipes.csv``
    ``moe_dispatcher``): every routed copy crosses the network, where HybridEP would send one per
    destination node. Priced as flex it was 12% too fast."""
    row_id = "mbridge_2511_b200_gptoss_120b_bf16_64_gbs512"
    runs = validate_published.pd.read_csv(validate_published.DEFAULT_CSV)
    case = validate_published.build_case(runs[runs["id"] == row_id].iloc[0], runs)
    assert case.cost_switches["moe_dispatcher"] == "alltoall"
    flex = validate_published.dataclasses.replace(case, cost_switches={"moe_dispatcher": "flex"})
    alltoall_s = validate_published.predict(case)["ep_comm_s"]
    assert alltoall_s > 1.15 * validate_published.predict(flex)["ep_comm_s"]
    error = blackwell[0].set_index("id").loc[row_id, "error_pct"]
    assert abs(error) <= 5.0
