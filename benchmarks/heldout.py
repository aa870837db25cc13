"""Held-out runs (issue 20): published Blackwell runs from other sources than the calibration
rows of ``validate_published.py``, on which no constant is fitted (``mlperf_heldout.py``:
MLPerf Training v5.1; ``nemo_heldout.py``: NeMo's 25.02-25.07 performance summaries). One table
of their residuals for both scripts, and the runs the error bands take them from
(``validate_published.py --write-bands``)."""

from __future__ import annotations

import csv
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_published import Case, predict  # noqa: E402


def residual_table(cases: list[Case]) -> list[dict[str, object]]:
    """Per run: measured and predicted step time, the error, whether it fits, its error-band
    class and the predicted time terms (``compute_s``, ``*_comm_s``)."""
    rows = []
    for case in cases:
        pred = predict(case)
        rows.append(
            {
                "id": case.row_id,
                "gpu": case.gpu.name,
                "generation": case.gpu.generation,
                "precision": case.precision,
                "moe": case.model.is_moe,
                "measured_s": case.measured_step_s,
                "predicted_s": pred["predicted_s"],
                "error_pct": 100.0 * (pred["predicted_s"] / case.measured_step_s - 1.0),
                "fits": pred["fits"],
                **{k: v for k, v in pred.items() if k.endswith("_comm_s") or k == "compute_s"},
            }
        )
    return rows


def read_cases(path: Path, build: Callable[[dict[str, str]], Case]) -> list[Case]:
    """Every row of a held-out CSV, built into a ``Case`` by its script's ``build``."""
    with path.open(newline="") as handle:
        return [build(row) for row in csv.DictReader(handle)]


def summary_lines(rows: list[dict[str, object]]) -> list[str]:
    """``summary`` of all of ``residual_table``'s rows, then of each GPU's."""
    lines = [summary("held out", [r["error_pct"] for r in rows])]
    for gpu in sorted({r["gpu"] for r in rows}):
        lines.append(summary(f"  {gpu}", [r["error_pct"] for r in rows if r["gpu"] == gpu]))
    return lines


def summary(label: str, errors: list[float]) -> str:
    """``label``: runs, median |error|, max |error| and signed median."""
    return (
        f"{label}: {len(errors)} runs, median |error| "
        f"{statistics.median(abs(e) for e in errors):.1f}%, "
        f"max {max(abs(e) for e in errors):.1f}%, signed median {statistics.median(errors):+.1f}%"
    )


def heldout_cases() -> list[Case]:
    """Every held-out run of both sources."""
    import mlperf_heldout  # noqa: PLC0415 (each imports this module's table)
    import nemo_heldout  # noqa: PLC0415

    return [*mlperf_heldout.heldout_cases(), *nemo_heldout.heldout_cases()]
