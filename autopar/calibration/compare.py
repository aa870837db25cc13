"""A profile against measured logs: predicted vs measured time per size, and the error per log."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from autopar.calibration.fit import MIB_BYTES, curve_points
from autopar.calibration.profile import CommProfile
from autopar.costs.comm import CollectiveModel


@dataclass(frozen=True, slots=True, kw_only=True)
class LogComparison:
    """One log against a model. ``median_abs_pct_error`` is over sizes >= 1 MiB (NaN if none)."""

    file: str
    collective: str
    ranks: int
    nodes: int
    size_bytes: tuple[float, ...]
    measured_s: tuple[float, ...]
    predicted_s: tuple[float, ...]
    median_abs_pct_error: float

    def to_dict(self) -> dict[str, object]:
        """The ``--format json`` record (per-size values left out)."""
        error = self.median_abs_pct_error
        return {
            "file": self.file,
            "collective": self.collective,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "median_abs_pct_error": None if np.isnan(error) else round(error, 3),
        }

    def to_frame(self) -> pd.DataFrame:
        measured = np.asarray(self.measured_s)
        predicted = np.asarray(self.predicted_s)
        return pd.DataFrame(
            {
                "size_bytes": np.asarray(self.size_bytes, dtype=np.int64),
                "measured_us": measured * 1e6,
                "predicted_us": predicted * 1e6,
                "error_pct": (predicted / measured - 1.0) * 100.0,
            }
        )


def compare_log(
    model: CollectiveModel | CommProfile, frame: pd.DataFrame
) -> tuple[LogComparison, ...]:
    """Compare one parsed log (``autopar.calibration.nccl.parse_nccl_log``) with ``model``: one
    record per collective in it (a bench log holds several)."""
    return tuple(_compare_one(model, group) for _, group in frame.groupby("collective", sort=False))


def _compare_one(model: CollectiveModel | CommProfile, frame: pd.DataFrame) -> LogComparison:
    points = curve_points(frame).groupby("size_bytes", as_index=False)["time_s"].median()
    first = frame.iloc[0]
    ranks, nodes = int(first["num_ranks"]), int(first["num_nodes"])
    size = points["size_bytes"].to_numpy(dtype=np.float64)
    measured = points["time_s"].to_numpy(dtype=np.float64)
    predicted = np.asarray(
        model.time_s(str(first["collective"]), size, num_ranks=ranks, num_nodes=nodes)
    )
    large = size >= MIB_BYTES
    error = np.abs(predicted[large] / measured[large] - 1.0) * 100.0
    return LogComparison(
        file=str(first["source"]),
        collective=str(first["collective"]),
        ranks=ranks,
        nodes=nodes,
        size_bytes=tuple(size.tolist()),
        measured_s=tuple(measured.tolist()),
        predicted_s=tuple(predicted.tolist()),
        median_abs_pct_error=float(np.median(error)) if error.size else float("nan"),
    )


def fitted_only(profile: CommProfile) -> CommProfile:
    """The profile without its measured curves: predictions come from the fits alone (what the
    fit-accuracy check measures; with curves, a log's own sizes are reproduced exactly)."""
    return CommProfile(
        curves=(),
        fits=profile.fits,
        sources=profile.sources,
        gemm=profile.gemm,
        fallback=profile.fallback,
    )
