"""How far a predicted step time may be off: the error band of its class (issue 20).

A class is (GPU generation, precision, dense or MoE). Its band is the 90th percentile of the
absolute relative errors of the default cost model on the class's published runs: the
calibration rows (``benchmarks/validate_published.py``) and the held-out runs from other
sources, on which nothing is fitted (``benchmarks/heldout.py``: MLPerf Training, NeMo's
performance summaries), so that the band says what the model keeps beyond the rows it was fitted
on. ``validate_published.py --write-bands`` writes both to ``error_bands.json`` beside this
module (``tests/test_error_bands.py`` checks the file is current). A
class with fewer than ``MIN_RUNS`` runs takes the band of the nearest wider class that has them
(the same generation and kind of model in any precision, then the same generation and
precision, then the same generation, then all runs) and says so: the
band of a prediction is never drawn from fewer than ``MIN_RUNS`` runs, and never silently from
another class.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any

import numpy as np

from autopar.costs.terms import TermContext
from autopar.inputs.specs import Problem

MIN_RUNS = 5
"""Fewest published runs a band is computed from."""
QUANTILE = 0.9
"""The band covers this share of a class's published runs."""
BANDS_FILE = "error_bands.json"
BANDED_COST_MODELS: tuple[str, ...] = ("default", "megatron-compatible")
"""The cost models the residuals were measured on (the two share their time terms); a plug-in
cost model's estimates carry no band."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorBand:
    """The relative error band of one class of predictions (module docstring)."""

    rel_error: float
    """Fraction: 0.06 means the measured step time was within 6% of the prediction for
    ``QUANTILE`` of the runs the band was drawn from."""
    num_runs: int
    """Published runs of the prediction's own class."""
    generation: str
    precision: str
    moe: bool
    source: str
    """``own`` when drawn from the class's runs, else the wider class it was drawn from
    (``blackwell dense``, ``hopper fp8``, ``hopper``, ``all``)."""
    source_runs: int
    """Runs the band was drawn from (``num_runs`` when ``source`` is ``own``)."""

    @property
    def few_runs(self) -> bool:
        return self.num_runs < MIN_RUNS

    @property
    def label(self) -> str:
        """The class, e.g. ``blackwell fp8 dense``."""
        return f"{self.generation or 'unknown'} {self.precision} {'moe' if self.moe else 'dense'}"

    def text(self) -> str:
        """``±6%, 38 published runs`` (a class with few runs says so and where the band is
        from)."""
        pct = f"±{100.0 * self.rel_error:.0f}%"
        if not self.few_runs:
            return f"{pct}, {self.num_runs} published runs"
        own = f"{self.num_runs} published run{'s' if self.num_runs != 1 else ''} of {self.label}"
        return f"{pct}; few runs: {own}, band from {self.source_runs} runs of {self.source}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rel_error": self.rel_error,
            "num_runs": self.num_runs,
            "class": self.label,
            "source": self.source,
            "source_runs": self.source_runs,
            "few_runs": self.few_runs,
            "text": self.text(),
        }


@cache
def residuals() -> tuple[tuple[str, str, bool, float], ...]:
    """``(generation, precision, moe, |error|)`` of every published run in ``error_bands.json``."""
    text = resources.files("autopar.costs").joinpath(BANDS_FILE).read_text()
    rows = json.loads(text)["runs"]
    return tuple(
        (r["generation"], r["precision"], bool(r["moe"]), float(r["abs_error"])) for r in rows
    )


def _band(errors: list[float]) -> float:
    return float(np.quantile(np.asarray(errors), QUANTILE, method="higher"))


def error_band(generation: str, precision: str, is_moe: bool) -> ErrorBand:
    """The band of predictions for ``generation`` x ``precision`` x dense/MoE (module
    docstring)."""
    return _error_band(residuals(), generation, precision, is_moe)


@lru_cache(maxsize=256)
def _error_band(runs: tuple, generation: str, precision: str, is_moe: bool) -> ErrorBand:
    """``error_band`` of the residuals ``runs``. Memoised: a pure function of a tuple of
    tuples and three scalars (every estimate asks it); the band is frozen."""
    own = [e for g, p, m, e in runs if (g, p, m) == (generation, precision, is_moe)]
    kind = "moe" if is_moe else "dense"
    same_kind = [e for g, _, m, e in runs if (g, m) == (generation, is_moe)]
    same_precision = [e for g, p, _, e in runs if (g, p) == (generation, precision)]
    wider = (
        (f"{generation} {kind}", same_kind),
        (f"{generation} {precision}", same_precision),
        (generation or "unknown", [e for g, _, _, e in runs if g == generation]),
        ("all", [e for *_, e in runs]),
    )
    source, errors = "own", own
    if len(own) < MIN_RUNS:
        source, errors = next((name, e) for name, e in wider if len(e) >= MIN_RUNS)
    return ErrorBand(
        rel_error=_band(errors),
        num_runs=len(own),
        generation=generation,
        precision=precision,
        moe=is_moe,
        source=source,
        source_runs=len(errors),
    )


def band_of(ctx: TermContext | Problem) -> ErrorBand:
    """The band of a problem's predictions: its GPU's generation, its precision, whether its
    model is MoE (``ctx``: a ``TermContext`` or a ``Problem``)."""
    return error_band(ctx.cluster.gpu.generation, ctx.training.precision, ctx.model.is_moe)
