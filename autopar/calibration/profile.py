"""The measured communication profile: curves from nccl-tests logs plus a fitted latency-bandwidth
model, implementing ``autopar.costs.comm.CollectiveModel``.

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

import hashlib
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from autopar.base.errors import InputError, excerpt, shorten
from autopar.base.files import write_atomic
from autopar.costs.comm import COLLECTIVES, CollectiveModel, bus_bandwidth_factor
from autopar.inputs.safe_yaml import load_mapping

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


def _nnls(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative least squares by enumerating active sets (at most 3 unknowns). On ties the
    smaller set wins, bandwidth column (1) first, so a single point fits bandwidth only."""
    order = [1, 0, 2][: a.shape[1]]
    best_x, best_sse = np.zeros(a.shape[1]), float(np.sum(b**2))
    for size in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(order, size):
            x, *_ = np.linalg.lstsq(a[:, subset], b, rcond=None)
            if np.any(x < 0):
                continue
            sse = float(np.sum((a[:, subset] @ x - b) ** 2))
            if sse < best_sse * (1.0 - 1e-9) - 1e-30:
                best_x, best_sse = np.zeros(a.shape[1]), sse
                best_x[list(subset)] = x
    return best_x, best_sse


def _fit_regime(
    collective: str, points: pd.DataFrame, *, min_size_bytes: float
) -> tuple[Regime, float]:
    """Weighted relative least squares of one regime over a grid of ramp exponents."""
    s = points["size_bytes"].to_numpy(dtype=np.float64)
    n = points["num_ranks"].to_numpy(dtype=np.float64)
    t = points["time_s"].to_numpy(dtype=np.float64)
    weight = np.where(s >= MIB_BYTES, LARGE_WEIGHT, 1.0) / t
    f = bus_bandwidth_factor(collective, n)
    best: tuple[float, float, np.ndarray] | None = None
    for k in RAMP_EXPONENTS:
        if k > 0 and points["size_bytes"].nunique() < MIN_REGIME_POINTS:
            continue
        columns = [latency_steps(collective, n), s * f] + ([s ** (1.0 - k) * f] if k else [])
        x, sse = _nnls(np.stack(columns, axis=1) * weight[:, None], weight * t)
        if best is None or sse < best[0] * (1.0 - 1e-9):
            best = (sse, k, x)
    assert best is not None
    sse, k, x = best
    ramp = float(x[2]) if k else 0.0
    regime = Regime(
        min_size_bytes=min_size_bytes,
        latency_per_step_s=float(x[0]),
        inverse_busbw_s_per_byte=float(x[1]),
        ramp_coefficient=ramp,
        ramp_exponent=k if ramp else 0.0,
    )
    return regime, sse


def _fit_regimes(collective: str, points: pd.DataFrame) -> tuple[Regime, ...]:
    """One regime, or two split at a size when that at least halves the fit error (module doc)."""
    one, sse_one = _fit_regime(collective, points, min_size_bytes=0.0)
    sizes = np.unique(points["size_bytes"])
    best: tuple[tuple[Regime, ...], float] = ((one,), sse_one)
    candidates = sizes[MIN_REGIME_POINTS : len(sizes) - MIN_REGIME_POINTS + 1]
    if len(candidates) > MAX_SPLIT_CANDIDATES:  # a fine sweep: try evenly spaced switch sizes
        picks = np.linspace(0, len(candidates) - 1, MAX_SPLIT_CANDIDATES).round().astype(int)
        candidates = candidates[np.unique(picks)]
    for split in candidates:
        below = points["size_bytes"] < split
        low, sse_low = _fit_regime(collective, points[below], min_size_bytes=0.0)
        high, sse_high = _fit_regime(collective, points[~below], min_size_bytes=float(split))
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


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceLog:
    """One log a profile was built from."""

    path: str
    sha256: str
    collective: str
    num_ranks: int
    num_nodes: int
    gpu: str | None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmPoint:
    """Achieved throughput of one ``(m, k) @ (k, n)`` matmul
    (``autopar.calibration.gemm_bench``)."""

    m: int
    n: int
    k: int
    dtype: str
    flop_per_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CommProfile:
    """Measured curves + fits; a ``CollectiveModel``. ``fallback`` (e.g. the datasheet model)
    answers collectives and spans the profile has no data for; it is not saved."""

    curves: tuple[Curve, ...]
    fits: tuple[CollectiveFit, ...]
    sources: tuple[SourceLog, ...] = ()
    gemm: tuple[GemmPoint, ...] = ()
    fallback: CollectiveModel | None = field(default=None, compare=False)

    def curve(self, collective: str, num_ranks: int, num_nodes: int) -> Curve | None:
        key = (collective, num_ranks, num_nodes)
        return next(
            (c for c in self.curves if (c.collective, c.num_ranks, c.num_nodes) == key), None
        )

    def fit(self, collective: str, span: str) -> CollectiveFit | None:
        return next((f for f in self.fits if (f.collective, f.span) == (collective, span)), None)

    def time_s(
        self,
        collective: str,
        size_bytes: np.ndarray,
        *,
        num_ranks: np.ndarray,
        num_nodes: np.ndarray,
    ) -> np.ndarray:
        """``CollectiveModel.time_s``: broadcasts; zero for one rank or zero bytes."""
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
        s, n, nodes = np.broadcast_arrays(
            np.asarray(size_bytes, dtype=np.float64),
            np.asarray(num_ranks, dtype=np.float64),
            np.asarray(num_nodes, dtype=np.float64),
        )
        out = np.zeros(s.shape)
        active = (s > 0) & (n > 1)
        for ranks, node_count in set(zip(n[active].tolist(), nodes[active].tolist(), strict=True)):
            group = active & (n == ranks) & (nodes == node_count)
            out[group] = self._group_time_s(collective, s[group], int(ranks), int(node_count))
        return out

    def _group_time_s(
        self, collective: str, size_bytes: np.ndarray, num_ranks: int, num_nodes: int
    ) -> np.ndarray:
        span = span_of(num_nodes)
        for name in (collective, SIBLINGS.get(collective)):
            fit = self.fit(name, span) if name else None
            if fit is not None:
                return self._measured_s(fit, name, size_bytes, num_ranks, num_nodes)
        derived = self._derived_s(collective, span, size_bytes, num_ranks, num_nodes)
        if derived is not None:
            return derived
        if self.fallback is not None:
            return np.asarray(
                self.fallback.time_s(
                    collective, size_bytes, num_ranks=num_ranks, num_nodes=num_nodes
                ),
                dtype=np.float64,
            )
        have = sorted({(f.collective, f.span) for f in self.fits})
        raise InputError(
            f"no data for {collective} {span}-node (have {have}) and no fallback model",
            source="communication profile",
        )

    def _measured_s(
        self, fit: CollectiveFit, name: str, size_bytes: np.ndarray, num_ranks: int, num_nodes: int
    ) -> np.ndarray:
        share = network_share(fit, num_ranks, num_nodes)
        return _anchored_s(
            fit, self.curve(name, num_ranks, num_nodes), size_bytes / share, num_ranks
        )

    def _derived_s(
        self, collective: str, span: str, size_bytes: np.ndarray, num_ranks: int, num_nodes: int
    ) -> np.ndarray | None:
        """A ring collective the profile lacks, from one it has (``DERIVATIONS``): all-reduce =
        reduce-scatter + all-gather of the same buffer (NCCL's ring all-reduce is exactly these
        two phases, Thakur et al. 2005 §4; nccl-tests busbw factors 2(n-1)/n = 2 x (n-1)/n);
        reduce-scatter or all-gather = half an all-reduce. ``None`` when neither is measured."""
        name = self._derivation_source(collective, span)
        if name is None:
            return None
        measured = self._measured_s(self.fit(name, span), name, size_bytes, num_ranks, num_nodes)
        # all-reduce: reduce-scatter + all-gather, the same ring traffic twice; else half.
        return 2.0 * measured if collective == "all_reduce" else 0.5 * measured

    def _derivation_source(self, collective: str, span: str) -> str | None:
        """The measured collective ``collective`` can be derived from in ``span``, if any."""
        for source in DERIVATIONS.get(collective, ()):
            for name in (source, SIBLINGS.get(source)):
                if name and self.fit(name, span) is not None:
                    return name
        return None

    def provenance(self) -> dict[str, str]:
        """Where each collective's time comes from, per span (``all_reduce/intra`` ...):
        ``measured``, ``derived from X`` (``_derived_s``) or ``datasheet`` (the fallback)."""
        out = {}
        for collective in COLLECTIVES:
            for span in SPANS:
                names = [n for n in (collective, SIBLINGS.get(collective)) if n]
                if any(self.fit(n, span) for n in names):
                    out[f"{collective}/{span}"] = "measured"
                    continue
                source = self._derivation_source(collective, span)
                out[f"{collective}/{span}"] = f"derived from {source}" if source else "datasheet"
        return out

    def gemm_flop_per_s(self, m, n, k, dtype: str) -> np.ndarray | float | None:
        """Achieved FLOP/s of ``(m x k) @ (k x n)`` GEMMs (``dtype`` ``bf16`` or ``fp8``;
        broadcasting arrays): an exact match, else inverse-distance interpolation in
        log(m, n, k) over the 4 nearest measured shapes of that dtype; None without data."""
        points = [p for p in self.gemm if p.dtype == dtype]
        if not points:
            return None
        measured = np.log([[p.m, p.n, p.k] for p in points])
        rates = np.array([p.flop_per_s for p in points])
        log_rates = np.log(rates)
        m, n, k = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (m, n, k)))
        queries = np.log(np.stack([m.ravel(), n.ravel(), k.ravel()], axis=1))
        distance = np.linalg.norm(queries[:, None, :] - measured[None, :, :], axis=2)
        nearest = np.argsort(distance, axis=1)[:, :4]
        near_distance = np.take_along_axis(distance, nearest, axis=1)
        weight = 1.0 / np.maximum(near_distance, 1e-12) ** 2
        rate = np.exp(np.sum(weight * log_rates[nearest], axis=1) / np.sum(weight, axis=1))
        exact = near_distance[:, 0] < 1e-9
        rate = np.where(exact, rates[nearest[:, 0]], rate)
        return float(rate[0]) if m.ndim == 0 else rate.reshape(m.shape)


def network_share(fit: CollectiveFit, num_ranks: int, num_nodes: int) -> float:
    """The fraction of the measured groups' network bandwidth a group crossing nodes gets.

    On rail-optimised clusters every GPU has its own NIC. A ring or tree collective (all_reduce,
    all_gather, reduce_scatter) that crosses nodes with ``g`` ranks on each node runs ``g``
    channels side by side, one per NIC, so its bus bandwidth scales with ``g``: a data-parallel
    group of one rank per node, predicted from logs of 8 ranks per node, gets 1/8 of their
    bandwidth (never more than they measured). Point-to-point traffic (send_recv, all_to_all)
    is already per rank: each rank drives its own NIC whatever the group, so its share is 1, as
    it is within a node. The group is timed as a message ``1/share`` times larger on the
    measured groups (its latency steps are unchanged).
    """
    per_rank = fit.collective in ("send_recv", "all_to_all")
    if per_rank or span_of(num_nodes) == "intra" or fit.ranks_per_node <= 0:
        return 1.0
    return min(1.0, (num_ranks / num_nodes) / fit.ranks_per_node)


def _anchored_s(
    fit: CollectiveFit, curve: Curve | None, size_bytes: np.ndarray, num_ranks: int
) -> np.ndarray:
    """Inside a measured curve: interpolate. Outside its sizes: the fit scaled to meet the nearest
    measured end point (continuous). No curve: the fit."""
    fitted = fit.time_s(size_bytes, num_ranks)
    if curve is None or curve.collective != fit.collective:
        return fitted
    lo, hi = curve.size_bytes[0], curve.size_bytes[-1]
    edge = np.clip(size_bytes, lo, hi)
    scale = curve.interpolate_s(edge) / fit.time_s(edge, num_ranks)
    inside = (size_bytes >= lo) & (size_bytes <= hi)
    return np.where(inside, curve.interpolate_s(edge), fitted * scale)


def fit_profile(
    frame: pd.DataFrame,
    *,
    sources: Sequence[SourceLog] = (),
    gemm: Sequence[GemmPoint] = (),
    fallback: CollectiveModel | None = None,
) -> CommProfile:
    """Curves and fits from a frame of ``autopar.calibration.nccl`` rows."""
    if frame.empty:
        raise InputError("no measurements to fit")
    curves = build_curves(frame)
    fits = tuple(
        fit
        for collective in COLLECTIVES
        for span in SPANS
        if (fit := fit_collective(collective, span, curves)) is not None
    )
    return CommProfile(
        curves=curves, fits=fits, sources=tuple(sources), gemm=tuple(gemm), fallback=fallback
    )


PROFILE_VERSION = 1


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _plain(obj: object) -> object:
    """Frozen dataclasses -> YAML-safe builtins (tuples as lists, inf as None)."""
    if hasattr(obj, "__dataclass_fields__"):
        return {
            name: _plain(getattr(obj, name))
            for name in obj.__dataclass_fields__
            if name != "fallback"
        }
    if isinstance(obj, tuple | list):
        return [_plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def profile_to_dict(profile: CommProfile) -> dict[str, object]:
    data = _plain(profile)
    assert isinstance(data, dict)
    return {"version": PROFILE_VERSION, **data}


def save_profile(profile: CommProfile, path: str | Path) -> None:
    """Write ``profile.yaml`` atomically (temporary file in the same folder, then os.replace)."""
    path = Path(path)
    write_atomic(
        path, yaml.safe_dump(profile_to_dict(profile), sort_keys=False, default_flow_style=None)
    )


MAX_PROFILE_BYTES = 64 << 20
"""A profile holds curves of many logs: up to 64 MiB."""
MAX_PROFILE_ITEMS = 100_000
"""Entries of any list in a profile (curves, fits, points of a curve ...)."""
MAX_PROFILE_NUMBER = 1e30
"""Any number in a profile (sizes in bytes, times in s, FLOP/s) is finite and at most this."""


def _bad(rule: str, *, source: str, where: str) -> InputError:
    return InputError(rule, source=source, field=where)


def _scalar(value: object, kind: str, *, source: str, where: str) -> object:
    """One field value of type ``kind`` (``int``, ``float``, ``str``, ``bool``), checked: numbers
    finite, non-negative and at most ``MAX_PROFILE_NUMBER``."""
    if kind == "str":
        if not isinstance(value, str) or len(value) > 4096:
            raise _bad(f"must be a string, got {excerpt(value)}", source=source, where=where)
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise _bad(f"must be true or false, got {excerpt(value)}", source=source, where=where)
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"must be a number, got {excerpt(value)}", source=source, where=where)
    if kind == "int" and not (isinstance(value, int) or float(value).is_integer()):
        raise _bad(f"must be an integer, got {excerpt(value)}", source=source, where=where)
    if isinstance(value, int) and value.bit_length() > 100:
        raise _bad(f"out of range: {excerpt(value)}", source=source, where=where)
    if not (math.isfinite(value) and 0 <= value <= MAX_PROFILE_NUMBER):
        raise _bad(
            f"must be a finite number in 0..{MAX_PROFILE_NUMBER:g}, got {excerpt(value)}",
            source=source,
            where=where,
        )
    return int(value) if kind == "int" else float(value)


def _value(value: object, annotation: str, *, source: str, where: str) -> object:
    """A field value by its dataclass annotation (``float``, ``str | None``,
    ``tuple[int, ...]``...); tuples of dataclasses are built by the caller."""
    if annotation.endswith(" | None"):
        if value is None:
            return None
        annotation = annotation.removesuffix(" | None")
    if annotation.startswith("tuple["):
        if not isinstance(value, list | tuple) or len(value) > MAX_PROFILE_ITEMS:
            raise _bad(f"must be a list, got {excerpt(value)}", source=source, where=where)
        kind = annotation.removeprefix("tuple[").split(",")[0]
        return tuple(
            _scalar(item, kind, source=source, where=f"{where}[{i}]")
            for i, item in enumerate(value)
        )
    return _scalar(value, annotation, source=source, where=where)


def _build(cls: type, data: object, *, source: str, where: str = "") -> object:
    """``cls`` from a mapping of its fields, each type-checked (a profile is a user file)."""
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise _bad(f"must be a mapping, got {excerpt(data)}", source=source, where=where)
    hints = {name: f.type for name, f in cls.__dataclass_fields__.items() if name != "fallback"}
    values: dict[str, object] = {}
    for name, annotation in hints.items():
        if name not in data:
            continue
        value = data[name]
        if name == "median_abs_pct_error" and value is None:
            values[name] = math.nan  # saved as null when not computed
        elif name == "regimes":
            values[name] = value  # built by the caller
        else:
            values[name] = _value(value, str(annotation), source=source, where=f"{where}.{name}")
    try:
        built = cls(**values)
    except TypeError as err:  # a required field is missing
        raise _bad(f"bad entry ({shorten(err, 80)})", source=source, where=where) from None
    _check_entry(built, source=source, where=where)
    return built


def _check_entry(entry: object, *, source: str, where: str) -> None:
    """Rules across fields: known collectives and spans, curves that can be interpolated."""
    collective = entry.collective if isinstance(entry, Curve | CollectiveFit) else None
    if collective is not None and collective not in COLLECTIVES:
        raise _bad(
            f"unknown collective {excerpt(collective)}; expected one of {', '.join(COLLECTIVES)}",
            source=source,
            where=where,
        )
    if isinstance(entry, CollectiveFit) and entry.span not in SPANS:
        raise _bad(
            f"span must be intra or inter, got {excerpt(entry.span)}", source=source, where=where
        )
    if isinstance(entry, Curve):
        sizes, times = entry.size_bytes, entry.time_s
        if not sizes or len(sizes) != len(times):
            raise _bad(
                "size_bytes and time_s must be non-empty lists of one length",
                source=source,
                where=where,
            )
        if min(sizes) <= 0 or min(times) <= 0 or any(b <= a for a, b in itertools.pairwise(sizes)):
            raise _bad(
                "sizes must be positive and increasing, times positive", source=source, where=where
            )
    if isinstance(entry, Curve | SourceLog) and min(entry.num_ranks, entry.num_nodes) < 1:
        raise _bad("num_ranks and num_nodes must be >= 1", source=source, where=where)
    if isinstance(entry, GemmPoint) and min(entry.m, entry.n, entry.k, entry.flop_per_s) <= 0:
        raise _bad("m, n, k and flop_per_s must be positive", source=source, where=where)


def _entries(data: Mapping[str, object], key: str, *, source: str) -> list[object]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_PROFILE_ITEMS:
        raise _bad(f"must be a list, got {excerpt(value)}", source=source, where=key)
    return value


def profile_from_dict(
    data: Mapping[str, object], *, source: str, fallback: CollectiveModel | None = None
) -> CommProfile:
    if not isinstance(data, Mapping) or data.get("version") != PROFILE_VERSION:
        raise InputError(f"not a version {PROFILE_VERSION} autopar profile", source=source)
    fits = []
    for i, entry in enumerate(_entries(data, "fits", source=source)):
        where = f"fits[{i}]"
        if not isinstance(entry, Mapping):
            raise _bad(f"must be a mapping, got {excerpt(entry)}", source=source, where=where)
        raw = entry.get("regimes")
        if not isinstance(raw, list) or not 1 <= len(raw) <= 16:
            raise _bad("regimes must be a list of 1 to 16 entries", source=source, where=where)
        regimes = tuple(
            _build(Regime, r, source=source, where=f"{where}.regimes[{j}]")
            for j, r in enumerate(raw)
        )
        fits.append(
            _build(CollectiveFit, {**entry, "regimes": regimes}, source=source, where=where)
        )
    return CommProfile(
        curves=_built(Curve, data, "curves", source),
        fits=tuple(fits),
        sources=_built(SourceLog, data, "sources", source),
        gemm=_built(GemmPoint, data, "gemm", source),
        fallback=fallback,
    )


def _built(cls: type, data: Mapping[str, object], key: str, source: str) -> tuple:
    return tuple(
        _build(cls, entry, source=source, where=f"{key}[{i}]")
        for i, entry in enumerate(_entries(data, key, source=source))
    )


def load_profile(path: str | Path, *, fallback: CollectiveModel | None = None) -> CommProfile:
    """Read a ``profile.yaml`` written by ``save_profile`` (bounded, safe loading, every field
    type-checked: ``InputError`` naming the entry otherwise)."""
    data = load_mapping(path, max_bytes=MAX_PROFILE_BYTES)
    return profile_from_dict(data, source=str(path), fallback=fallback)
