"""Fit the few Blackwell constants on the calibration rows and print them (issue 20).

    python benchmarks/fit_blackwell.py

Three kinds of constant are fitted here, nothing else (benchmarks/README.md "Blackwell"):

1. ``gemm_efficiency`` of each Blackwell GPU preset: the sustained fraction of the datasheet
   BF16 peak under Megatron-Bridge's recipes. B200, GB200 and GB300: such that the preset's dense
   BF16 / FP8 / MXFP8 rows have a signed median error of zero (the MoE rows carry their own
   H100-calibrated constants, so they do not set a GPU's efficiency where dense rows exist).
   B300 has only MoE rows: its value sets their signed median to zero (the median is robust to
   the GPT-OSS rows, which the model misses on every GPU). Same-silicon SKUs differ in clocks and
   power (B200 1,000 W, B300 1,100 W, GB200 1,200 W, GB300 1,400 W) and the datasheet peaks do
   not show it; the script prints the rows' same-layout, same-container pairs as the cross-check.
2. ``FP4_TO_FP8_EFFICIENCY`` (``cost_models.gemm``): NVFP4 GEMMs against FP8 ones, such that
   the NVFP4 rows have a signed median error of zero, the per-GPU efficiencies above held.
3. ``MXFP8_GEMM_SLOWDOWN`` is not fitted but derived from the tables' MXFP8 / FP8-CS pairs
   (same row, the parenthesised alternative); printed here so it can be checked.
4. ``BLACKWELL_FP8_TO_BF16_EFFICIENCY`` (``cost_models.gemm``) is not fitted either: measured by
   Transformer Engine's B300 GEMM profile (BF16 against MXFP8 kernels of one layer, the citation
   at the constant); the efficiencies above are fitted with it in place.

Each efficiency is found by bisection on the GPU preset's value (a replaced ``GpuSpec``), so the
script changes no file: copy the printed values into the presets.

``--scans`` also prints the two scans benchmarks/README.md cites: the Blackwell attention
backward factor (``BLACKWELL_BACKWARD_SLOWDOWN``, the dense rows refitted at each value) and a
fixed per-layer, per-micro-batch time (refitted Blackwell dense rows; the sub-second Hopper rows,
whose efficiencies are measured, not refitted).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_published as vp  # noqa: E402
from published_blackwell import mxfp8_pairs  # noqa: E402

import cost_models.attention as attention  # noqa: E402
import cost_models.compute as compute  # noqa: E402
import cost_models.gemm as gemm  # noqa: E402
from cost_models.shapes import stage_layers  # noqa: E402

BLACKWELL = ("b200", "b300", "gb200-nvl72", "gb300-nvl72")
PAIRS = (
    # (row, the other GPU's row at the same layout and container) -> sustained-throughput ratio
    ("mbridge_2511_gb300_llama3_8b_fp8cs_8", "mbridge_2511_gb200_llama3_8b_fp8cs_8"),
    ("mbridge_2511_gb200_llama3_8b_fp8cs_8", "mbridge_2511_b200_llama3_8b_fp8cs_8"),
    (
        "mbridge_260401_gb300_llama3_70b_fp8_64_gbs256",
        "mbridge_260401_gb200_llama3_70b_fp8_64_gbs256",
    ),
    (
        "mbridge_260401_b300_gptoss_120b_bf16_64_gbs1280",
        "mbridge_260401_b200_gptoss_120b_bf16_64_gbs1280",
    ),
    (
        "mbridge_260401_gb300_gptoss_120b_bf16_64_gbs1280",
        "mbridge_260401_gb200_gptoss_120b_bf16_64_gbs1280",
    ),
)


def blackwell_cases() -> list[vp.Case]:
    runs = vp.pd.read_csv(vp.DEFAULT_CSV)
    out = []
    for _, row in runs.iterrows():
        if vp.is_blackwell_row(row):
            case = vp.build_case(row, runs)
            if not isinstance(case, str):
                out.append(case)
    return out


def signed_median(cases: list[vp.Case]) -> float:
    errors = [vp.predict(c)["predicted_s"] / c.measured_step_s - 1.0 for c in cases]
    return float(np.median(errors))


def with_efficiency(cases: list[vp.Case], value: float) -> list[vp.Case]:
    return [
        dataclasses.replace(c, gpu=dataclasses.replace(c.gpu, gemm_efficiency=value)) for c in cases
    ]


def bisect(error_of, low: float, high: float, steps: int = 30) -> float:
    """The root of a decreasing ``error_of`` in [low, high]."""
    for _ in range(steps):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if error_of(mid) > 0 else (low, mid)
    return 0.5 * (low + high)


def fit_gpu(cases: list[vp.Case]) -> float:
    return bisect(lambda e: signed_median(with_efficiency(cases, e)), 0.2, 1.0)


def fit_fp4(cases: list[vp.Case], efficiencies: dict[str, float]) -> float:
    cases = [
        dataclasses.replace(
            c, gpu=dataclasses.replace(c.gpu, gemm_efficiency=efficiencies[c.gpu.name])
        )
        for c in cases
    ]

    def error(ratio: float) -> float:
        saved = gemm.FP4_TO_FP8_EFFICIENCY
        gemm.FP4_TO_FP8_EFFICIENCY = ratio
        try:
            return signed_median(cases)
        finally:
            gemm.FP4_TO_FP8_EFFICIENCY = saved

    return bisect(error, 0.05, 1.0)


def tokens_per_s(row_id: str) -> float:
    runs = vp.pd.read_csv(vp.DEFAULT_CSV).set_index("id")
    return float(re.search(r"tokens_per_s_per_gpu=(\d+)", runs.loc[row_id, "notes"]).group(1))


def _dense_fit(cases: list[vp.Case]) -> tuple[float, float]:
    """(median, max) |error| % of the dense Blackwell rows, each GPU's efficiency refitted."""
    errors = []
    for name in ("b200", "gb200-nvl72", "gb300-nvl72"):
        own = [c for c in cases if c.gpu.name == name and not c.model.is_moe]
        own = [c for c in own if c.precision != "nvfp4"]
        fitted = with_efficiency(own, fit_gpu(own))
        errors += [abs(vp.predict(c)["predicted_s"] / c.measured_step_s - 1.0) for c in fitted]
    return 100.0 * float(np.median(errors)), 100.0 * float(np.max(errors))


def scan_backward(cases: list[vp.Case]) -> None:
    print("\nBLACKWELL_BACKWARD_SLOWDOWN scan (dense rows, efficiencies refitted):")
    saved = dict(attention.BACKWARD_SLOWDOWN)
    try:
        for value in (1.15, 1.5, 2.0, 2.5):
            attention.BACKWARD_SLOWDOWN.update({g: value for g in saved})
            median, worst = _dense_fit(cases)
            print(f"  {value:.2f}: median {median:.1f}%, max {worst:.1f}%")
    finally:
        attention.BACKWARD_SLOWDOWN.update(saved)


def scan_fixed_cost(cases: list[vp.Case]) -> None:
    print("\nfixed time per layer and micro-batch (Blackwell dense refitted; Hopper steps < 1 s):")
    original = compute.DenseComputeTime.evaluate
    fixed = [0.0]

    def patched(self, grid, ctx):
        layers = stage_layers(ctx.model.num_layers, np.asarray(grid["pp"], dtype=np.float64))
        return original(self, grid, ctx) + fixed[0] * layers

    compute.DenseComputeTime.evaluate = patched
    try:
        for value in (0.0, 0.2e-3, 0.5e-3, 1e-3):
            fixed[0] = value
            median, worst = _dense_fit(cases)
            table, _ = vp.validate(vp.DEFAULT_CSV)
            small = table[(table["source"] != "mbridge_blackwell") & (table["measured_s"] < 1.0)]
            errors = small["error_pct"].abs()
            print(
                f"  {value * 1e3:.1f} ms: Blackwell dense median {median:.1f}%, max {worst:.1f}%;"
                f" Hopper < 1 s ({len(small)} rows) median {errors.median():.1f}%,"
                f" max {errors.max():.1f}%"
            )
    finally:
        compute.DenseComputeTime.evaluate = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", action="store_true", help="also print the two scans")
    args = parser.parse_args()
    cases = blackwell_cases()
    efficiencies = {}
    for name in ("b200", "gb200-nvl72", "gb300-nvl72"):
        own = [c for c in cases if c.gpu.name == name and c.precision != "nvfp4"]
        own = [c for c in own if not c.model.is_moe]
        efficiencies[name] = fit_gpu(own)
        print(f"{name}: gemm_efficiency {efficiencies[name]:.3f} ({len(own)} dense rows)")
    own = [c for c in cases if c.gpu.name == "b300" and c.precision != "nvfp4"]
    efficiencies["b300"] = fit_gpu(own)
    print(f"b300: gemm_efficiency {efficiencies['b300']:.3f} ({len(own)} MoE rows)")
    fp4 = [c for c in cases if c.precision == "nvfp4"]
    print(f"FP4_TO_FP8_EFFICIENCY {fit_fp4(fp4, efficiencies):.3f} ({len(fp4)} rows)")
    print("\nsame-layout pairs (measured throughput ratio, datasheet BF16 peak ratio):")
    presets = {c.row_id: c.gpu for c in cases}
    for a, b in PAIRS:
        ratio = tokens_per_s(a) / tokens_per_s(b)
        peak = presets[a].peak_bf16_flop_per_s / presets[b].peak_bf16_flop_per_s
        fitted = efficiencies[presets[a].name] / efficiencies[presets[b].name] * peak
        print(f"  {a} / {b}: {ratio:.3f} measured, {peak:.2f} datasheet, {fitted:.3f} fitted")
    print(f"\nMXFP8 / FP8-CS step time, MXFP8_GEMM_SLOWDOWN = {gemm.MXFP8_GEMM_SLOWDOWN}:")
    runs = vp.pd.read_csv(vp.DEFAULT_CSV)
    for row_id, measured, predicted in mxfp8_pairs(cases, runs, vp.predict):
        print(f"  {row_id}: measured {measured:.3f}, predicted {predicted:.3f}")
    if args.scans:
        scan_backward(cases)
        scan_fixed_cost(cases)


if __name__ == "__main__":
    main()
