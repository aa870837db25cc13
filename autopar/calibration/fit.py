"""The fit of a measured communication profile (``autopar.calibration.profile``): curves from
nccl-tests logs and the latency-bandwidth model fitted to them.

Model (per collective and span, span = ``intra`` when the group is on one node, else ``inter``)::

    t(s, n) = alpha(n) + s * f(n) / busbw(s)                 (nccl-tests doc/PERFORMANCE.md)
    busbw(s) = B / (1 + (h / s) ** k)                        (saturating bus bandwidth)
    alpha(n) = a * steps(n)

- ``f(n)`` is the nccl-tests bus-bandwidth factor (``autopar.costs.comm.bus_bandwidth_factor``), so
``B``
  (peak bus bandwidth) is comparable across rank counts for ring algorithms (same doc: "busbw ...
  should be independent of the number of ranks"). One ``B, h, k`` is shared by all rank counts of
  a span; with ``k = 0`` the model is the plain alpha-beta (Hockney) model.
- ``busbw(s)`` ramps up with size because NCCL uses fewer channels and lighter protocols for small
  messages (NCCL ``src/graph/tuning.cc``); ``h`` is the size at half the peak bus bandwidth.
- ``steps(n)``: latency grows with ranks. all_reduce: ``1 + log2(n)`` -- NCCL's double binary
  tree / LL protocol serves small all_reduces across nodes and its depth is logarithmic (NVIDIA
  blog "Massively Scale Your Deep Learning Training with NCCL 2.4", 2019); the ABCI A100 logs
  show the same (about 7-8 us per doubling from 16 to 128 ranks). all_gather / reduce_scatter:
  ``n`` (ring: ``n - 1`` steps, plus one launch), all_to_all: ``n`` (one message per peer),
  send_recv: ``1``.
- NCCL switches algorithm / protocol at some size (tuning.cc picks the fastest predicted one), which
  shows as a kink in some curves (GCP A3 Mega at 16-32 MiB). The fit therefore allows two regimes
  with a switch size when that halves the fit error.

Known traps, recorded in each fit's ``notes``:
- 2-node all_reduce busbw overstates the network (tree / NVLS, see nccl-tests issue #309): when
  logs with more than 2 nodes exist, 2-node all_reduce curves are kept as curves but left out of
  the inter-node fit; when only 2-node data exists the fit says so.
- a sweep that stops before saturation (ABCI: 32 MiB) never shows the peak: the fit then extends
  beyond its largest size with the bus bandwidth reached there, a lower bound of the peak.

Prediction: inside a measured (collective, ranks, nodes) curve, log-log interpolation; outside its
size range, the fitted model scaled to meet the nearest measured end point; for an unmeasured
(ranks, nodes), the fitted model. A collective with no data uses its sibling with the same
bus-bandwidth semantics (all_gather <-> reduce_scatter) or the ``fallback`` model, else errors.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from autopar.costs.comm import COLLECTIVES, bus_bandwidth_factor

try:  # the gufunc np.linalg.lstsq calls (numpy 2): one call solves a stack (``_lstsq_each``)
    from numpy.linalg._umath_linalg import lstsq as _LSTSQ
except ImportError:  # another numpy: lstsq matrix by matrix
    _LSTSQ = None

MIB_BYTES = 2**20
SPANS: tuple[str, ...] = ("intra", "inter")
SIBLINGS: dict[str, str] = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}
DERIVATIONS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("reduce_scatter",),
    "reduce_scatter": ("all_reduce",),
    "all_gather": ("all_reduce",),
}
"""Collectives derivable from another measured one (``CommProfile._derived_s``); a sibling
(``SIBLINGS``: same ring traffic) is used as measured first."""
RAMP_EXPONENTS: tuple[float, ...] = (0.0, 0.2, 0.35, 0.5, 0.6, 0.7, 0.8, 0.9)
LARGE_WEIGHT = 4.0
"""Relative weight of sizes >= 1 MiB in the fit: the planner's large messages matter most."""
SATURATED_FRACTION = 0.9
"""A sweep counts as saturated when busbw at its largest size is >= 90% of the fitted peak."""
TWO_REGIME_GAIN = 0.5
MAX_SPLIT_CANDIDATES = 48
"""Switch sizes tried for a two-regime fit: every measured size of a usual sweep (nccl-tests
doubles the size: about 30), evenly spaced ones of a finer sweep, so the fit time is bounded."""
MIN_REGIME_POINTS = 4
TWO_NODE_EXCESS = 1.35
"""2-node all_reduce busbw above this multiple of the larger runs' is taken as the tree/NVLS
artefact. A ring's busbw also declines slowly with node count (ABCI A100, 2 -> 16 nodes: 1.25x),
while the artefact is larger (H100 issue #309: 466 vs 321 GB/s, 1.45x)."""


def span_of(num_nodes: float) -> str:
    """``intra`` for a group inside one node, ``inter`` otherwise."""
    return "intra" if num_nodes <= 1 else "inter"


def latency_steps(collective: str, num_ranks: np.ndarray | float) -> np.ndarray:
    """Latency steps of one call (module docstring: tree depth for all_reduce, ring steps else)."""
    n = np.asarray(num_ranks, dtype=np.float64)
    if collective == "all_reduce":
        return 1.0 + np.log2(np.maximum(n, 1.0))
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return n
    if collective == "send_recv":
        return np.ones_like(n)
    raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Regime:
    """One algorithm/protocol regime: ``t = a*steps(n) + s*f(n)*(1/B + c*s**-k)``, i.e. the bus
    bandwidth ``busbw(s) = 1 / (1/B + c*s**-k)`` saturates at ``B`` (``c = 0``: alpha-beta)."""

    min_size_bytes: float
    """Smallest size this regime serves (0 for the first)."""
    latency_per_step_s: float
    inverse_busbw_s_per_byte: float
    """``1/B``; 0 when the sweep shows no saturation at all."""
    ramp_coefficient: float
    """``c`` in s * bytes**(k-1): how far below the peak small messages stay."""
    ramp_exponent: float

    def time_s(self, size_bytes: np.ndarray, collective: str, num_ranks: np.ndarray) -> np.ndarray:
        s = np.maximum(np.asarray(size_bytes, dtype=np.float64), 1.0)
        f = bus_bandwidth_factor(collective, num_ranks)
        per_byte_s = self.inverse_busbw_s_per_byte + self.ramp_coefficient * s**-self.ramp_exponent
        return self.latency_per_step_s * latency_steps(collective, num_ranks) + s * f * per_byte_s

    def busbw_bytes_per_s(self, size_bytes: float) -> float:
        s = max(float(size_bytes), 1.0)
        per_byte_s = self.inverse_busbw_s_per_byte + self.ramp_coefficient * s**-self.ramp_exponent
        return math.inf if per_byte_s == 0.0 else 1.0 / per_byte_s

    @property
    def busbw_peak_bytes_per_s(self) -> float:
        inverse = self.inverse_busbw_s_per_byte
        return math.inf if inverse == 0.0 else 1.0 / inverse


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveFit:
    """Fitted model of one (collective, span); ``notes`` say what it can and cannot be used for."""

    collective: str
    span: str
    regimes: tuple[Regime, ...]
    max_size_bytes: float
    """Largest fitted size; beyond it the bus bandwidth stays at its value there."""
    saturated: bool
    """False: the sweep never reached the peak and the bandwidth beyond it is a lower bound."""
    rank_counts: tuple[int, ...]
    node_counts: tuple[int, ...]
    ranks_per_node: float = 0.0
    """Most ranks per node among the fitted curves (0 when unknown); see ``network_share``."""
    notes: tuple[str, ...] = ()

    median_abs_pct_error: float = math.nan
    """Of the fitted model against its own curves, sizes >= 1 MiB."""

    def time_s(self, size_bytes: np.ndarray, num_ranks: np.ndarray) -> np.ndarray:
        s = np.asarray(size_bytes, dtype=np.float64)
        n = np.asarray(num_ranks, dtype=np.float64)
        s_fit = np.minimum(s, self.max_size_bytes)
        out = np.zeros(np.broadcast(s, n).shape)
        for regime in self.regimes:
            t = regime.time_s(s_fit, self.collective, n)
            out = np.where(s_fit >= regime.min_size_bytes, t, out)
        # Beyond the sweep: the bus bandwidth reached at its largest size (a lower bound of the
        # peak when the sweep is not saturated).
        edge_busbw = self.regimes[-1].busbw_bytes_per_s(self.max_size_bytes)
        f = bus_bandwidth_factor(self.collective, n)
        return out + np.maximum(s - self.max_size_bytes, 0.0) * f / edge_busbw


@dataclass(frozen=True, slots=True, kw_only=True)
class Curve:
    """Measured times of one (collective, num_ranks, num_nodes), median over logs per size."""

    collective: str
    num_ranks: int
    num_nodes: int
    size_bytes: tuple[float, ...]
    time_s: tuple[float, ...]
    sources: tuple[str, ...]

    def interpolate_s(self, size_bytes: np.ndarray) -> np.ndarray:
        """Log-log interpolation; sizes outside the measured range are clipped to it."""
        log_t = np.interp(np.log(size_bytes), np.log(self.size_bytes), np.log(self.time_s))
        return np.exp(log_t)


Fit = tuple[np.ndarray, float] | None
"""One active set's least-squares coefficients and squared error; ``None`` when one is < 0."""


@functools.cache
def _subsets(unknowns: int) -> tuple[tuple[int, ...], ...]:
    """The active sets of ``_nnls``, smaller first, bandwidth column (1) first."""
    order = [1, 0, 2][:unknowns]
    return tuple(c for size in range(1, unknowns + 1) for c in itertools.combinations(order, size))


def _lstsq_each(stacked: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """``np.linalg.lstsq(m, b, rcond=None)[0]`` for each matrix ``m`` of ``stacked``, in one call
    of the LAPACK gufunc that ``lstsq`` calls once per matrix (numpy ``linalg/_linalg.py``: the
    same routine, ``rcond`` and numbers, so the same bits; ``lstsq`` itself takes one matrix,
    and its checks cost more than the solve here). Without that gufunc, or where it reports a
    failure, ``lstsq`` matrix by matrix (which raises as it always did)."""
    rows, unknowns = stacked.shape[-2:]
    rcond = np.finfo(np.float64).eps * max(rows, unknowns)
    if _LSTSQ is not None and rows:
        try:
            with np.errstate(invalid="raise", over="ignore", divide="ignore", under="ignore"):
                x = _LSTSQ(stacked, b[:, None], rcond, signature="ddd->ddid")[0]
            return [x[i, :, 0].copy() for i in range(len(stacked))]
        except FloatingPointError:
            pass
    return [np.linalg.lstsq(m, b, rcond=None)[0] for m in stacked]


def _subset_fits(
    matrices: Sequence[np.ndarray], b: np.ndarray, subsets: Sequence[tuple[int, ...]]
) -> list[dict[tuple[int, ...], Fit]]:
    """For each matrix, each subset's least-squares fit of ``b`` on those columns, in that
    order, and its squared error (``None`` when a coefficient is negative): one ``_lstsq_each``
    per subset size."""
    out: list[dict[tuple[int, ...], Fit]] = [{} for _ in matrices]
    for size in sorted({len(subset) for subset in subsets}):
        jobs = [
            (i, sub, a[:, sub])
            for i, a in enumerate(matrices)
            for sub in subsets
            if len(sub) == size
        ]
        solved = _lstsq_each(np.stack([columns for _, _, columns in jobs]), b)
        for (i, subset, columns), x in zip(jobs, solved, strict=True):
            # ndarray.any / .sum: the reductions np.any / np.sum run, without their wrappers
            fit = None if (x < 0).any() else (x, float(((columns @ x - b) ** 2).sum()))
            out[i][subset] = fit
    return out


def _nnls(a: np.ndarray, b: np.ndarray, fits: dict | None = None) -> tuple[np.ndarray, float]:
    """Non-negative least squares by enumerating active sets (at most 3 unknowns). On ties the
    smaller set wins, bandwidth column (1) first, so a single point fits bandwidth only.
    ``fits``: every active set's ``_subset_fits`` when made already (``_fit_regime``)."""
    subsets = _subsets(a.shape[1])
    fits = _subset_fits([a], b, subsets)[0] if fits is None else fits
    best_x, best_sse = np.zeros(a.shape[1]), float(np.sum(b**2))
    for subset in subsets:
        fit = fits[subset]
        if fit is None:
            continue
        x, sse = fit
        if sse < best_sse * (1.0 - 1e-9) - 1e-30:
            best_x, best_sse = np.zeros(a.shape[1]), sse
            best_x[list(subset)] = x
    return best_x, best_sse


def _fit_regime(
    collective: str, s: np.ndarray, n: np.ndarray, t: np.ndarray, *, min_size_bytes: float
) -> tuple[Regime, float]:
    """Weighted relative least squares of one regime over a grid of ramp exponents, on the
    points' sizes ``s``, rank counts ``n`` and times ``t`` (float arrays)."""
    weight = np.where(s >= MIB_BYTES, LARGE_WEIGHT, 1.0) / t
    f = bus_bandwidth_factor(collective, n)
    # the columns every exponent shares, and the number of distinct sizes (curve points have
    # a size > 0, so no NaN to leave out), computed once rather than per exponent
    steps, bandwidth = latency_steps(collective, n), s * f
    sizes = len(np.unique(s))
    target = weight * t
    exponents = [k for k in RAMP_EXPONENTS if not k or sizes >= MIN_REGIME_POINTS]
    matrices = {
        k: np.stack([steps, bandwidth] + ([s ** (1.0 - k) * f] if k else []), axis=1)
        * weight[:, None]
        for k in exponents
    }
    # the fits on the latency and bandwidth columns alone are the same at every exponent: made
    # once; those with the ramp column, for every exponent in one batch
    (shared,) = _subset_fits([matrices[0.0]], target, _subsets(2))
    ramped = [k for k in exponents if k]
    with_ramp = [subset for subset in _subsets(3) if 2 in subset]
    ramp = _subset_fits([matrices[k] for k in ramped], target, with_ramp) if ramped else []
    fits = {0.0: shared} | {k: shared | more for k, more in zip(ramped, ramp, strict=True)}
    best: tuple[float, float, np.ndarray] | None = None
    for k in exponents:
        x, sse = _nnls(matrices[k], target, fits[k])
        if best is None or sse < best[0] * (1.0 - 1e-9):
            best = (sse, k, x)
    assert best is not None
    sse, k, x = best
    ramp_coefficient = float(x[2]) if k else 0.0
    regime = Regime(
        min_size_bytes=min_size_bytes,
        latency_per_step_s=float(x[0]),
        inverse_busbw_s_per_byte=float(x[1]),
        ramp_coefficient=ramp_coefficient,
        ramp_exponent=k if ramp_coefficient else 0.0,
    )
    return regime, sse


def _fit_regimes(collective: str, points: pd.DataFrame) -> tuple[Regime, ...]:
    """One regime, or two split at a size when that at least halves the fit error (module doc)."""
    # numpy columns, read once: each split candidate fits two regimes on their slices
    s, n, t = (points[c].to_numpy(dtype=np.float64) for c in ("size_bytes", "num_ranks", "time_s"))
    one, sse_one = _fit_regime(collective, s, n, t, min_size_bytes=0.0)
    sizes = np.unique(s)
    best: tuple[tuple[Regime, ...], float] = ((one,), sse_one)
    candidates = sizes[MIN_REGIME_POINTS : len(sizes) - MIN_REGIME_POINTS + 1]
    if len(candidates) > MAX_SPLIT_CANDIDATES:  # a fine sweep: try evenly spaced switch sizes
        picks = np.linspace(0, len(candidates) - 1, MAX_SPLIT_CANDIDATES).round().astype(int)
        candidates = candidates[np.unique(picks)]
    # a split is taken only below ``needed``; errors are >= 0, so a split whose low regime alone
    # errs more cannot be taken (its sum rounds to no less) and its high regime is not fitted
    needed = TWO_REGIME_GAIN * sse_one
    for split in candidates:
        below = s < split
        above = ~below
        low, sse_low = _fit_regime(collective, s[below], n[below], t[below], min_size_bytes=0.0)
        if sse_low > needed or sse_low >= best[1]:
            continue
        high, sse_high = _fit_regime(
            collective, s[above], n[above], t[above], min_size_bytes=float(split)
        )
        if sse_low + sse_high < best[1]:
            best = ((low, high), sse_low + sse_high)
    return best[0] if best[1] <= TWO_REGIME_GAIN * sse_one else (one,)


def curve_points(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with size > 0 and a time: out-of-place time, in-place where out-of-place is N/A."""
    time_us = frame["time_us_out"].fillna(frame["time_us_in"])
    points = frame.assign(time_s=time_us * 1e-6)
    return points[(points["size_bytes"] > 0) & points["time_s"].gt(0)]


def build_curves(frame: pd.DataFrame) -> tuple[Curve, ...]:
    """One curve per (collective, ranks, nodes): median time per size over all its logs."""
    curves = []
    keys = ["collective", "num_ranks", "num_nodes"]
    for (collective, ranks, nodes), group in curve_points(frame).groupby(keys):
        per_size = group.groupby("size_bytes")["time_s"].median()
        curves.append(
            Curve(
                collective=str(collective),
                num_ranks=int(ranks),
                num_nodes=int(nodes),
                size_bytes=tuple(float(v) for v in per_size.index),
                time_s=tuple(float(v) for v in per_size.to_numpy()),
                sources=tuple(sorted(set(group["source"]))),
            )
        )
    return tuple(curves)


def _select_for_fit(
    collective: str, span: str, curves: Sequence[Curve]
) -> tuple[list[Curve], list[str]]:
    """Curves that enter the (collective, span) fit, and the trap notes that apply."""
    chosen = [c for c in curves if c.collective == collective and span_of(c.num_nodes) == span]
    notes: list[str] = []
    two_node = [c for c in chosen if c.num_nodes == 2]
    more_nodes = [c for c in chosen if c.num_nodes > 2]
    if collective != "all_reduce" or not two_node:
        return chosen, notes
    if not more_nodes:
        notes.append(
            "fitted on 2-node all_reduce only: busbw may be overstated by the tree/NVLS algorithms "
            "(nccl-tests issue #309); predictions for > 2 nodes may be optimistic"
        )
    elif _two_node_excess(two_node, more_nodes) > TWO_NODE_EXCESS:
        chosen = [c for c in chosen if c.num_nodes != 2]
        notes.append(
            "2-node all_reduce left out of the fit: its busbw exceeds the larger runs' by more "
            f"than {TWO_NODE_EXCESS:.2f}x (tree/NVLS, nccl-tests issue #309); kept as a curve"
        )
    return chosen, notes


def _busbw_at_bytes_per_s(curve: Curve, size_bytes: float) -> float:
    time_s = float(curve.interpolate_s(np.asarray(size_bytes)))
    return size_bytes * float(bus_bandwidth_factor(curve.collective, curve.num_ranks)) / time_s


def _two_node_excess(two_node: Sequence[Curve], more_nodes: Sequence[Curve]) -> float:
    """Ratio of the best 2-node busbw to the best larger-run busbw at their largest common size."""
    common = min(max(c.size_bytes) for c in (*two_node, *more_nodes))
    best_two = max(_busbw_at_bytes_per_s(c, common) for c in two_node)
    return best_two / max(_busbw_at_bytes_per_s(c, common) for c in more_nodes)


def _points_of(curves: Sequence[Curve]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "size_bytes": np.concatenate([c.size_bytes for c in curves]),
            "time_s": np.concatenate([c.time_s for c in curves]),
            "num_ranks": np.concatenate([[c.num_ranks] * len(c.size_bytes) for c in curves]),
        }
    )


def fit_collective(collective: str, span: str, curves: Sequence[Curve]) -> CollectiveFit | None:
    """Fit one (collective, span) from its curves (module docstring); None without data."""
    chosen, notes = _select_for_fit(collective, span, curves)
    if not chosen:
        return None
    points = _points_of(chosen)
    regimes = _fit_regimes(collective, points)
    max_size = float(points["size_bytes"].max())
    last = regimes[-1]
    saturated = last.busbw_bytes_per_s(max_size) >= SATURATED_FRACTION * last.busbw_peak_bytes_per_s
    if not saturated:
        notes.append(
            f"sweep stops at {max_size / MIB_BYTES:g} MiB before busbw saturates: the bandwidth "
            "used beyond it is a lower bound"
        )
    if len({c.num_ranks for c in chosen}) == 1:
        notes.append("one rank count: latency scaling with ranks is the assumed steps(n) law")
    fit = CollectiveFit(
        collective=collective,
        span=span,
        regimes=regimes,
        max_size_bytes=max_size,
        saturated=bool(saturated),
        rank_counts=tuple(sorted({c.num_ranks for c in chosen})),
        node_counts=tuple(sorted({c.num_nodes for c in chosen})),
        ranks_per_node=max(c.num_ranks / c.num_nodes for c in chosen),
        notes=tuple(notes),
    )
    large = points[points["size_bytes"] >= MIB_BYTES]
    if large.empty:
        return fit
    predicted = fit.time_s(large["size_bytes"].to_numpy(), large["num_ranks"].to_numpy())
    error = np.median(np.abs(predicted / large["time_s"].to_numpy() - 1.0)) * 100.0
    return replace(fit, median_abs_pct_error=float(error))
