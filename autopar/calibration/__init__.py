"""Calibration: nccl-tests logs -> measured communication profile (``CollectiveModel``)."""

from __future__ import annotations

from autopar.calibration.compare import LogComparison, compare_log, fitted_only
from autopar.calibration.nccl import parse_nccl_log, parse_nccl_text, read_nccl_logs
from autopar.calibration.profile import (
    CommProfile,
    GemmPoint,
    SourceLog,
    fit_profile,
    load_profile,
    save_profile,
)

__all__ = [
    "CommProfile",
    "GemmPoint",
    "LogComparison",
    "SourceLog",
    "compare_log",
    "fit_profile",
    "fitted_only",
    "load_profile",
    "parse_nccl_log",
    "parse_nccl_text",
    "read_nccl_logs",
    "save_profile",
]
