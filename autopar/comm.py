"""Collective-communication timing: the protocol every source of collective times follows.

Sizes follow the nccl-tests convention (nccl-tests `doc/PERFORMANCE.md`), so a measured log maps
onto the protocol without conversion:

- ``all_reduce``: ``size_bytes`` is the buffer every rank holds (input = output size).
- ``all_gather``: ``size_bytes`` is the gathered output, i.e. the sum over ranks of what each sends.
- ``reduce_scatter``: ``size_bytes`` is the input each rank holds (the sum of all output shards).
- ``all_to_all``: ``size_bytes`` is each rank's whole send buffer (all destinations together).
- ``send_recv``: ``size_bytes`` is what one rank sends to its peer.

Bus bandwidth factors (same source): ``busbw = algbw * f(n)`` with ``f = 2(n-1)/n`` for
all_reduce, ``(n-1)/n`` for all_gather, reduce_scatter and all_to_all, ``1`` for send_recv.

Two implementations exist: the datasheet alpha-beta model in ``cost_models/communication.py`` and
the measured profile fitted from nccl-tests logs in ``autopar/calibration/``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

COLLECTIVES: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send_recv",
)


def bus_bandwidth_factor(collective: str, num_ranks: np.ndarray | int) -> np.ndarray:
    """nccl-tests bus-bandwidth factor f(n) (nccl-tests doc/PERFORMANCE.md)."""
    n = np.asarray(num_ranks, dtype=np.float64)
    if collective == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1.0) / n
    if collective == "send_recv":
        return np.ones_like(n)
    raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")


@runtime_checkable
class CollectiveModel(Protocol):
    """Predicts the time of one collective call.

    All arguments broadcast against each other (numpy arrays); the result has their shape.
    ``num_ranks`` is the group size; ``num_nodes`` how many nodes the group spans (1 = NVLink only).
    A group of one rank, or a zero-byte message, takes zero time.
    """

    def time_s(
        self,
        collective: str,
        size_bytes: np.ndarray,
        *,
        num_ranks: np.ndarray,
        num_nodes: np.ndarray,
    ) -> np.ndarray: ...
