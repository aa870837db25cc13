"""The measured communication profile: curves from nccl-tests logs plus a fitted latency-bandwidth
model (``autopar.calibration.fit``, where the model and its traps are written down),
implementing ``autopar.costs.comm.CollectiveModel``.

Prediction: inside a measured (collective, ranks, nodes) curve, log-log interpolation; outside its
size range, the fitted model scaled to meet the nearest measured end point; for an unmeasured
(ranks, nodes), the fitted model. A collective with no data uses its sibling with the same
bus-bandwidth semantics (all_gather <-> reduce_scatter) or the ``fallback`` model, else errors.
Files: ``autopar.calibration.profile_io``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from autopar.base.errors import InputError
from autopar.calibration.fit import (
    DERIVATIONS,
    SIBLINGS,
    SPANS,
    CollectiveFit,
    Curve,
    build_curves,
    fit_collective,
    span_of,
)
from autopar.costs.comm import COLLECTIVES, CollectiveModel


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
