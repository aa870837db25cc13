"""Calibration accuracy on the nccl-tests logs in ``tests/data/nccl`` (sources in SOURCES.md there).

1. Per-log fit error: a profile fitted on one log alone, evaluated by its fitted model only (no
   measured curves), median |error| over sizes >= 1 MiB (target <= 10%).
2. Cross-node-count prediction: fitted on some node counts of one cluster, predicting another node
   count it has not seen (target <= 25% for sizes >= 1 MiB).

Usage: ``python benchmarks/calibration_accuracy.py [NCCL_TESTS_DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from autopar.calibration.compare import compare_log, fitted_only
from autopar.calibration.nccl import parse_nccl_log
from autopar.calibration.profile import fit_profile

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "nccl"

# (cluster, logs fitted, log predicted)
CROSS_CASES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "ABCI A100",
        ("a100_2n8g_all_reduce_abci.log", "a100_16n8g_all_reduce_abci.log"),
        "a100_4n8g_all_reduce_abci.log",
    ),
    (
        "ABCI A100",
        ("a100_2n8g_all_reduce_abci.log", "a100_16n8g_all_reduce_abci.log"),
        "a100_8n8g_all_reduce_abci.log",
    ),
    (
        "ABCI A100",
        ("a100_2n8g_all_reduce_abci.log", "a100_4n8g_all_reduce_abci.log"),
        "a100_16n8g_all_reduce_abci.log",
    ),
    (
        "ABCI A100",
        ("a100_4n8g_all_reduce_abci.log", "a100_16n8g_all_reduce_abci.log"),
        "a100_2n8g_all_reduce_abci.log",
    ),
    (
        "H100 issue #309",
        ("h100_2n8g_all_reduce_ncclissue309_gjaion.log",),
        "h100_8n8g_all_reduce_ncclissue309_gjaion.log",
    ),
)


def per_log_fit_errors(folder: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(folder.glob("*.log")):
        frame = parse_nccl_log(path)
        profile = fit_profile(frame)
        (record,) = compare_log(fitted_only(profile), frame)
        fit = profile.fits[0]
        rows.append(
            {
                "log": path.name,
                "median_abs_pct_error": record.median_abs_pct_error,
                "regimes": len(fit.regimes),
                "saturated": fit.saturated,
            }
        )
    return pd.DataFrame(rows)


def cross_node_errors(folder: Path) -> pd.DataFrame:
    rows = []
    for cluster, fitted, predicted in CROSS_CASES:
        frames = [parse_nccl_log(folder / name) for name in fitted]
        profile = fit_profile(pd.concat(frames, ignore_index=True))
        (record,) = compare_log(profile, parse_nccl_log(folder / predicted))
        rows.append(
            {
                "cluster": cluster,
                "fitted_nodes": "+".join(str(int(f["num_nodes"].iat[0])) for f in frames),
                "predicted_nodes": record.nodes,
                "median_abs_pct_error": record.median_abs_pct_error,
                "notes": "; ".join(n for f in profile.fits for n in f.notes),
            }
        )
    return pd.DataFrame(rows)


def main(argv: list[str]) -> int:
    folder = Path(argv[1]) if len(argv) > 1 else DEFAULT_DIR
    pd.set_option("display.width", 200, "display.max_colwidth", 90)
    print("Per-log fit error (fitted model only, sizes >= 1 MiB):")
    print(per_log_fit_errors(folder).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print("\nCross-node-count prediction error (sizes >= 1 MiB):")
    print(cross_node_errors(folder).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
