"""What the cost model reads of a pipeline schedule (``autopar.costs.schedule`` simulates it):
the slots of each phase in the step (closed forms where they are exact, else the critical path
of the simulation at reference phase times, a lower bound) and the micro-batches each rank
holds in flight at its activation peak, from each schedule's own order.
"""

from __future__ import annotations

import functools

import numpy as np

from autopar.costs.schedule import _schedule_graph, local_chunks, simulate
from autopar.costs.schedule_orders import V_SHAPED, first_chunks

EXTRAPOLATE_ABOVE = 3
"""Past ``3*pp`` micro-batches a schedule's activation peak no longer grows (its warm-up is
over; ``tests/test_schedule_slots.py``)."""
STEADY_FROM = 2
"""From ``2*pp`` micro-batches on, a schedule's slots are simulated at ``2*pp`` and ``3*pp``
and taken on the line through them: with equal stages every schedule here is in its steady
state by then, and each micro-batch adds the same operations to the longest path
(``tests/test_schedule_slots.py`` checks it against direct simulation)."""


def orderable(schedule: str, pp: int, vpp: int, m: int) -> bool:
    """Whether ``schedule`` has an order for this shape (what its code builds at all; the
    frameworks' further limits are rules, ``autopar.layout.schedule_rules``): the V schedules
    two chunks per rank, GPipe one, DualPipeV ``m >= 2*pp``, DualPipe an even ``pp`` and ``m``
    with ``m >= 2*pp`` (deepseek-ai/DualPipe dualpipe.py L332-333), the interleaved orders whole
    rounds of micro-batches."""
    if schedule in V_SHAPED:
        return vpp == 2 and (schedule != "dualpipe-v" or m >= 2 * pp)
    if schedule == "gpipe" or schedule == "dualpipe":
        even = schedule == "gpipe" or (pp % 2 == 0 and m % 2 == 0 and m >= 2 * pp)
        return vpp == 1 and even
    if vpp > 1 and schedule in ("1f1b", "zb-h1"):  # torch: whole rounds (L3192-3198)
        return m % max(1, m // pp) == 0
    if schedule == "combined-1f1b":  # Megatron: VPP with pp > 1, whole groups of pp
        return pp == 1 or (vpp > 1 and m % pp == 0)
    return True


def _closed_slots(schedule: str, pp: int, vpp: int, m: int, ratio) -> tuple | None:
    """The slots of the schedules whose longest path has a closed form for equal stages, or
    ``None``: 1F1B and GPipe ``m + pp - 1`` (Narayanan et al. 2021 §2.2, GPipe Huang et al.
    2019 §2.2), interleaved and Looped BFS ``m + (pp-1)/vpp`` (Narayanan §2.2.2, Lamy-Poirier
    2023 §4; interleaved with fewer than ``pp`` micro-batches, torch's one round of ``m``, each
    missing one adds ``(vpp-1)/vpp``), ZB-H1 ``(pp-1)/vpp`` times
    ``max(F, B, F + B - W)`` beyond ``m`` (Qi et al. 2024 §3.1, ZB-H1: ``(p-1)(T_F + T_B -
    T_W)`` where ``T_W`` is at most ``T_F`` and ``T_B``; the max covers the others), Megatron's
    combined 1F1B the interleaved slots for every phase with ``pp`` fewer paired steps on the
    path than slots (the warm-up and drain run unpaired), each found equal to the simulation
    in ``tests/test_schedule_slots.py``."""
    f, b, w, _ = ratio
    if pp == 1 and schedule not in ("dualpipe-v", "dualpipe"):  # one rank: no bubble
        return (m, m, m, m - 1) if schedule == "combined-1f1b" else (m, m, m, 0)
    if schedule == "gpipe" or (schedule == "1f1b" and vpp == 1):
        return (m + pp - 1,) * 3 + (0,)
    if schedule == "1f1b":  # torch's rounds of max(pp, m) micro-batches; below pp, less overlap
        short = max(0, pp - m)
        return (m + (pp - 1) / vpp + short * (vpp - 1) / vpp,) * 3 + (0,)
    if schedule == "combined-1f1b" and m % pp == 0:  # every phase as interleaved; pp pairs less
        slots = m + (pp - 1) / vpp
        return (slots, slots, slots, slots - pp)
    if m % pp == 0 and schedule == "looped-bfs":
        return (m + (pp - 1) / vpp,) * 3 + (0,)
    if m >= pp and schedule == "zb-h1":
        extra = (pp - 1) / vpp
        forms = {f: (1, 0, 0), b: (0, 1, 0), f + b - w: (1, 1, -1)}
        shape = forms[max(forms)]
        return tuple(m + extra * k for k in shape) + (0,)
    return None


CLOSED_FORMS: frozenset[str] = frozenset({"1f1b", "combined-1f1b", "gpipe"})
"""Schedules whose slots are a closed form with one longest path at every shape they run
(``_closed_slots``; elsewhere not ``orderable``): ``ratio_free`` everywhere, so scoring them
never gives a lower bound (``tests/test_schedule_slots.py``)."""


def ratio_free(schedule: str, pp: int, vpp: int, m: int) -> bool:
    """Whether ``schedule_slots`` are the same at every phase time: a closed form with one
    longest path (all but ZB-H1's, whose path is the longest of three forms)."""
    if not orderable(schedule, pp, vpp, m):
        return True
    closed = _closed_slots(schedule, pp, vpp, m, (1.0, 1.0, 1.0, 0.0))
    return closed is not None and (schedule != "zb-h1" or pp == 1)


def _simulated_counts(schedule: str, pp: int, vpp: int, m: int, ratio) -> np.ndarray:
    f, b, w, h = (x / vpp for x in ratio)
    sim = simulate(schedule, pp, vpp, m, f, b, w, pair_hidden_s=h, critical=True)
    return np.asarray(sim.critical, dtype=np.float64) / vpp


@functools.lru_cache(maxsize=65536)
def schedule_slots(schedule: str, pp: int, vpp: int, m: int, ratio) -> tuple[float, ...]:
    """Slots of each phase: ``(forward, input gradient, weight gradient, pairs)`` such that one
    step's pipeline takes ``sF*F + sI*I + sW*W - sP*H`` for equal stages whose micro-batch
    times are ``ratio = (F, I, W, H)`` (``H``: what one paired step hides). They are the
    operations on the longest path at those times (per stage: a chunk's operation counts
    ``1/vpp``), so at any other times they give the length of that same path: a lower bound of
    the step, exact at ``ratio`` (and everywhere for the closed forms)."""
    if not orderable(schedule, pp, vpp, m):
        return (np.inf, np.inf, np.inf, 0.0)
    closed = _closed_slots(schedule, pp, vpp, m, ratio)
    if closed is not None:
        return tuple(float(x) for x in closed)
    if pp == 1 or m < STEADY_FROM * pp or m in (STEADY_FROM * pp, (STEADY_FROM + 1) * pp):
        return tuple(_simulated_counts(schedule, pp, vpp, m, ratio).tolist())
    low = _simulated_counts(schedule, pp, vpp, STEADY_FROM * pp, ratio)
    high = _simulated_counts(schedule, pp, vpp, (STEADY_FROM + 1) * pp, ratio)
    return tuple((low + (high - low) * (m - STEADY_FROM * pp) / pp).tolist())


SEQUENTIAL_PAIRS: frozenset[str] = frozenset({"dualpipe-v"})
"""Schedules whose paired steps run the forward to its end before the backward: torch's
runtime runs ``OVERLAP_F_B``'s sub-actions one after the other (schedules.py L2889-2894;
torchtitan registers no overlapped runner), so the forward's activations are all held before
the backward frees any. Megatron's combined 1F1B and DeepSeek's DualPipe interleave the two
layer by layer, so their pairs are counted once done."""


def _held_at_peak(arrays, vpp: int, *, sequential_pairs: bool) -> tuple[int, ...]:
    """Per chunk, the micro-batches whose activations a rank holds at its peak, from its steps'
    ``(phase0, chunk0, phase1, chunk1)`` (``_Graph.steps``): a forward takes them, a whole
    backward or a weight gradient gives them back (an input gradient keeps what the weight
    gradient needs: Qi et al. 2024 §4.1 count ``M_B`` until ``W``)."""
    p0, c0, p1, c1 = arrays
    sign = np.array([1, 0, -1, -1])  # F, I, W, B
    first = np.zeros((len(p0), vpp), dtype=np.int64)
    first[np.arange(len(p0)), c0] = sign[p0]
    second = np.zeros_like(first)
    paired = p1 >= 0
    second[np.flatnonzero(paired), c1[paired]] = sign[p1[paired]]
    after = np.cumsum(first + second, axis=0)
    held = after
    if sequential_pairs:  # the moment between a pair's forward and its backward counts too
        held = np.concatenate([after, after - second])
    peak = int(np.argmax(held.sum(axis=1)))
    return tuple(int(x) for x in held[peak])


def interleaved_peak_units(pp, vpp, m, rank=0, *, zero_bubble: bool = False):
    """Chunk forwards an interleaved loop-style rank holds at its peak (``vpp > 1``): its
    warm-up, ``(vpp-1)*g + 2*(pp-1-rank)`` forwards with ``g = m // max(1, m // pp)``
    micro-batches per group (Megatron ``get_pp_rank_microbatches``, torch ``_get_warmup_ops``),
    plus one, at most all ``m*vpp``; ZB-H1 warms up ``pp-1-rank`` fewer and frees nothing for
    ``rank`` more steps (``_closed_in_flight``). Scalars or arrays (the activation terms,
    ``cost_models.pipeline``)."""
    group = m // np.maximum(1, m // np.maximum(pp, 1))
    factor, extra = (1, rank) if zero_bubble else (2, 0)
    return np.minimum((vpp - 1) * group + factor * (pp - 1 - rank) + 1 + extra, m * vpp)


def _closed_in_flight(schedule: str, pp: int, vpp: int, m: int, rank: int) -> tuple | None:
    """The peaks that have a closed form (each equal to the order's in
    ``tests/test_schedule_slots.py``), or ``None``. The loop-style schedules peak once their
    warm-up is done: 1F1B (and the combined 1F1B, whose extra warm-up forward is offset by the
    pair that follows) holds the first ``warm-up + 1`` forwards, ``min(pp - rank, m)`` without
    interleaving (Megatron ``get_pp_rank_microbatches``, torch ``_get_warmup_ops``); ZB-H1
    frees nothing before its first ``W``, ``rank`` steps later (torch
    ``num_1f1b_microbatches = rank``). The V schedules peak in their first ``F1``: ZB-V holds
    ``2*pp - rank - 1`` micro-batches on the first chunk and ``rank + 1`` on the second (once the
    padding to ``2*pp - 1`` is gone), DualPipeV one more on the first (its first pair)."""
    total = m * vpp
    if schedule in ("1f1b", "combined-1f1b", "zb-h1") and (vpp > 1 or schedule != "zb-h1"):
        if vpp == 1:
            return (min(pp - rank, m),)
        group = m // max(1, m // pp)
        zero_bubble = schedule == "zb-h1"
        units = int(interleaved_peak_units(pp, vpp, m, rank, zero_bubble=zero_bubble))
        return first_chunks(m, vpp, group, min(units, total))
    if schedule == "zb-v" and m >= 2 * pp - 1:
        return (2 * pp - rank - 1, rank + 1)
    if schedule == "dualpipe-v" and m >= 2 * pp:
        return (2 * pp - rank, rank + 1)
    return None


@functools.lru_cache(maxsize=4096)
def in_flight_chunks(schedule: str, pp: int, vpp: int, m: int) -> tuple[tuple[int, ...], ...]:
    """Per rank, per local chunk: the micro-batches held at the rank's peak (``_held_at_peak``;
    with ``SEQUENTIAL_PAIRS`` a paired step peaks after its forward).
    GPipe and Looped BFS run every forward first, so they hold all ``m``; the others peak in
    their warm-up, so past ``EXTRAPOLATE_ABOVE*pp`` micro-batches the peak no longer grows
    (``tests/test_schedule_slots.py``)."""
    if schedule in ("gpipe", "looped-bfs") or not orderable(schedule, pp, vpp, m):
        return ((m,) * vpp,) * pp
    closed = [_closed_in_flight(schedule, pp, vpp, m, rank) for rank in range(pp)]
    if all(c is not None for c in closed):
        return tuple(closed)
    m = min(m, EXTRAPOLATE_ABOVE * pp)
    graph = _schedule_graph(schedule, pp, vpp, m)
    sequential = schedule in SEQUENTIAL_PAIRS
    chunks = local_chunks(schedule, vpp)
    return tuple(
        _held_at_peak(arrays, chunks, sequential_pairs=sequential) for arrays in graph.steps
    )
