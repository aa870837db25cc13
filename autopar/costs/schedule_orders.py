"""The operation order of each pipeline schedule, rank by rank.

A rank runs a list of *steps*; a step is one operation, or two that the schedule issues together
(DualPipeV's ``OVERLAP_F_B``, Megatron's combined 1F1B). An operation is ``(phase, stage,
micro-batch)``: ``F`` forward, ``B`` whole backward, or the backward split in two, ``I`` (input
gradient) and ``W`` (weight gradient), on the global virtual stage ``stage``. Each order below
is re-derived from the framework's own code (cited per function); ``tests/test_schedule_orders.py``
compares them with ``torch.distributed.pipelining``'s tables (``get_schedule_ops``) and with
Megatron's.

Stage placement: loop-style schedules put virtual stage ``q`` on rank ``q % pp`` (chunk
``q // pp``); V-shaped ones (``zb-v``, ``dualpipe-v``) put stages ``r`` and ``2*pp-1-r`` on rank
``r`` (torch ``generate_stage_to_rank_mapping(style="v")``), so rank 0 holds the first and the
last stage. DualPipe (validation only, no framework autopar emits for runs it) holds two
directions: stage ``k`` of direction ``d`` is ``d*pp + k``, on rank ``k`` (``d = 0``) or
``pp-1-k`` (``d = 1``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from autopar.layout.stages import V_PLACED, chunk_place, placed_chunks, placement_of

Op = tuple[str, int, int]
"""``(phase, stage, micro-batch)``; phase ``F``, ``B`` (whole backward), ``I`` or ``W``."""
Step = tuple[Op, ...]

V_SHAPED: frozenset[str] = V_PLACED
"""The V-placed schedules (declared with the placement, ``autopar.layout.stages``)."""
PAIRED: frozenset[str] = frozenset({"combined-1f1b", "dualpipe-v", "dualpipe"})
"""The schedules with steps of two operations (a forward issued with a backward), the only
ones whose pairs hide communication (``tests/test_schedule_orders.py`` checks the orders)."""


@functools.cache
def megatron_chunks(num_microbatches: int, vpp: int, group: int) -> tuple[int, ...]:
    """Chunk of each forward in Megatron's interleaved order (``schedules.py``
    ``get_schedule_table``: groups of ``group`` micro-batches, each group through every chunk)."""
    out: list[int] = []
    for first in range(0, num_microbatches, group):
        last = min(first + group, num_microbatches)
        out += [chunk for chunk in range(vpp) for _ in range(first, last)]
    return tuple(out)


def first_chunks(m: int, vpp: int, group: int, units: int) -> tuple[int, ...]:
    """How many of the first ``units`` forwards of ``megatron_chunks(m, vpp, group)`` fall on
    each chunk, group by group (each group of micro-batches runs through every chunk)."""
    counts = [0] * vpp
    for first in range(0, m, group):
        size = min(group, m - first)
        for chunk in range(vpp):
            take = min(size, units)
            counts[chunk] += take
            units -= take
            if units == 0:
                return tuple(counts)
    return tuple(counts)


def _one_f_one_b(pp: int, vpp: int, m: int, rank: int) -> list[Step]:
    """torch ``Schedule1F1B._step_microbatches`` (schedules.py L1263-1390: ``min(m, pp - rank)``
    forwards, then backward / forward alternating), which is Megatron's
    ``forward_backward_pipelining_without_interleaving`` order (``p - rank - 1`` warm-up
    forwards, then forward/backward pairs)."""
    warm = min(m, pp - rank)
    steps: list[Step] = [(("F", rank, b),) for b in range(warm)]
    for b in range(m):
        steps.append((("B", rank, b),))
        if warm + b < m:
            steps.append((("F", rank, warm + b),))
    return steps


def _gpipe(pp: int, vpp: int, m: int, rank: int) -> list[Step]:
    """torch ``ScheduleGPipe`` (L1083-1204): every forward, then every backward."""
    return [(("F", rank, b),) for b in range(m)] + [(("B", rank, b),) for b in range(m)]


def _looped_bfs(pp: int, vpp: int, m: int, rank: int) -> list[Step]:
    """torch ``ScheduleLoopedBFS._calculate_single_rank_operations`` (L2964-2990): each local
    stage's forwards for every micro-batch, then the backwards in reverse."""
    stages = [rank + c * pp for c in range(vpp)]
    steps: list[Step] = [(("F", s, b),) for s in stages for b in range(m)]
    return steps + [(("B", s, b),) for s in reversed(stages) for b in reversed(range(m))]


def _per_round(pp: int, m: int) -> int:
    """torch interleaved schedules: ``rounds = max(1, m // pp)``, ``m // rounds`` micro-batches
    per round (``ScheduleInterleaved1F1B.__init__``, L3192-3198)."""
    return m // max(1, m // pp)


def _torch_interleaved(
    pp: int, vpp: int, m: int, rank: int, *, factor: int, zero_bubble: bool
) -> list[Step]:
    """torch ``_get_warmup_ops`` (L3130-3146) and ``_get_1f1b_rank_ops`` (L2993-3127): warm-up
    forwards, then forward + backward (``I`` with zero bubble) per step, then the remaining
    backwards; with zero bubble each rank defers its ``W`` by ``rank`` steps
    (``num_1f1b_microbatches = rank``, L3372) and runs the rest at the end."""
    per_round = _per_round(pp, m)
    total = m * vpp
    warm = min((vpp - 1) * per_round + factor * (pp - 1 - rank), total)

    def fwd_stage(step: int) -> int:
        return ((step // per_round) % vpp) * pp + rank

    def bwd_stage(step: int) -> int:
        return (vpp - 1 - ((step - warm) // per_round) % vpp) * pp + rank

    counts: dict[tuple[str, int], int] = {}

    def take(phase: str, stage: int) -> Op:
        index = counts.get((phase, stage), 0)
        counts[(phase, stage)] = index + 1
        return (phase, stage, index)

    steps: list[Step] = []
    back = "I" if zero_bubble else "B"
    backward_ops: list[int] = []
    weights = 0
    for op in range(total + warm):
        if op < total:
            steps.append((take("F", fwd_stage(op)),))
        if op < warm:
            continue
        steps.append((take(back, bwd_stage(op)),))
        backward_ops.append(op)
        if zero_bubble and op - warm >= rank:
            steps.append((take("W", bwd_stage(backward_ops[weights])),))
            weights += 1
    while zero_bubble and weights < len(backward_ops):
        steps.append((take("W", bwd_stage(backward_ops[weights])),))
        weights += 1
    return steps


def _interleaved(pp: int, vpp: int, m: int, rank: int) -> list[Step]:
    """``1f1b`` with ``vpp > 1``: torch ``ScheduleInterleaved1F1B`` (L3212-3262, warm-up factor
    2), which for ``m % pp == 0`` is Megatron's ``forward_backward_pipelining_with_interleaving``
    (``get_pp_rank_microbatches`` warm-up ``2*(p - r - 1) + (v - 1)*p``, L929-986;
    ``get_schedule_table`` chunk order)."""
    return _torch_interleaved(pp, vpp, m, rank, factor=2, zero_bubble=False)


def _zb_h1(pp: int, vpp: int, m: int, rank: int) -> list[Step]:
    """torch ``ScheduleInterleavedZeroBubble`` (L3330-3385): ZB-H1's order (Qi et al. 2024
    §3.1: W deferred to fill the 1F1B bubble) over ``vpp`` chunks, warm-up factor 1. Its
    ``_add_bubbles_to_actions`` (L3387) only inserts idle slots; the order is unchanged."""
    return _torch_interleaved(pp, vpp, m, rank, factor=1, zero_bubble=True)


def _zb_v(pp: int, vpp: int, m: int, rank: int) -> list[Step]:
    """torch ``ScheduleZBVZeroBubble._calculate_single_rank_operations`` (L3526-3648; Qi et al.
    2024 §6, ZB-V): two chunks in a V, warm-up, then ``F I W`` on both chunks per step, then the
    deferred ``W``. It pads to ``max(2*pp - 1, m)`` micro-batches and drops the padding."""
    n = max(2 * pp - 1, m)
    s0, s1 = rank, 2 * pp - 1 - rank
    ops: list[Op] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (pp - rank) - 1):
        ops.append(("F", s0, f0))
        f0 += 1
    for _ in range(rank):
        ops += [("F", s1, f1), ("F", s0, f0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(pp - rank):
        ops += [("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            ops.append(("F", s0, f0))
            f0 += 1
        ops += [("I", s0, b0), ("W", s0, b0), ("F", s1, f1), ("I", s1, b1), ("W", s1, b1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(rank):
        ops += [("I", s0, b0), ("I", s1, b1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(pp - rank):
        ops += [("I", s0, b0), ("W", s0, w0)]
        b0, w0 = b0 + 1, w0 + 1
    ops += [("W", s1, w) for w in range(w1, b1)] + [("W", s0, w) for w in range(w0, b0)]
    return [(op,) for op in ops if op[2] < m]


class _Counters:
    """Per (stage, phase) micro-batch counters and a FIFO of deferred weight gradients, as in
    torch ``ScheduleDualPipeV`` and deepseek-ai/DualPipe's ``WeightGradStore``."""

    def __init__(self) -> None:
        self.count: dict[tuple[int, str], int] = {}
        self.weights: list[Op] = []

    def next(self, stage: int, phase: str) -> int:
        index = self.count.get((stage, phase), 0)
        self.count[(stage, phase)] = index + 1
        return index

    def backward(self, stage: int, split: bool) -> Op:
        """A backward: whole (``B``) or its input half (``I``, the ``W`` queued)."""
        index = self.next(stage, "B")
        if split:
            self.weights.append(("W", stage, index))
            return ("I", stage, index)
        return ("B", stage, index)

    def weight(self) -> list[Step]:
        return [(self.weights.pop(0),)] if self.weights else []


def _dualpipe_v(pp: int, vpp: int, m: int, rank: int) -> list[Step]:
    """torch ``ScheduleDualPipeV._calculate_single_rank_operations`` (L3717-3876; DeepSeek's
    DualPipeV, deepseek-ai/DualPipe ``dualpipev.py`` step() L331-395): eight phases; the main
    one pairs the forward of one chunk with the whole backward of the other
    (``OVERLAP_F_B``)."""
    s0, s1 = rank, 2 * pp - 1 - rank
    c = _Counters()
    out: list[Step] = []

    def f(stage: int) -> Op:
        return ("F", stage, c.next(stage, "F"))

    out += [(f(s0),) for _ in range((pp - rank - 1) * 2)]
    for _ in range(rank + 1):
        out += [(f(s0),), (f(s1),)]
    for _ in range(pp - rank - 1):
        out.append((c.backward(s1, True),))
        out += c.weight()
        out.append((f(s1),))
    for i in range(m - 2 * pp + rank + 1):
        if i == 0 and rank == pp - 1:
            out += [(f(s0),), (c.backward(s1, False),)]
        else:
            out.append((f(s0), c.backward(s1, False)))
        out.append((f(s1), c.backward(s0, False)))
    for _ in range(pp - rank - 1):
        out.append((c.backward(s1, False),))
        out.append((f(s1), c.backward(s0, False)))
    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        out.append((c.backward(s1, split),))
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        out.append((c.backward(s0, split),))
    for _ in range(pp - rank - 1):
        out += c.weight()
        out.append((c.backward(s0, split),))
    for _ in range(rank + 1):
        out += c.weight()
    return out


def _dualpipe(pp: int, vpp: int, m: int, rank: int) -> list[Step]:
    """deepseek-ai/DualPipe ``dualpipe.py`` step() (L358-425; DeepSeek-V3 report §3.2.1,
    Figure 5): two directions of ``m/2`` micro-batches each; a rank's phase 0 is its own
    direction in the first half of the ranks, the other in the second (``phase ^=
    is_in_second_half``); the middle ranks do not overlap their first pair (L384-391)."""
    half = min(rank, pp - 1 - rank)
    halves, second = pp // 2, rank >= pp // 2
    middle = rank in (halves - 1, halves)
    c = _Counters()
    out: list[Step] = []

    def stage(phase: int) -> int:
        return rank if phase ^ second == 0 else pp + (pp - 1 - rank)

    def f(phase: int) -> Op:
        return ("F", stage(phase), c.next(stage(phase), "F"))

    def b(phase: int, split: bool = False) -> Op:
        return c.backward(stage(phase), split)

    out += [(f(0),) for _ in range((halves - half - 1) * 2)]
    for _ in range(half + 1):
        out += [(f(0),), (f(1),)]
    for _ in range(halves - half - 1):
        out.append((b(1, True),))
        out += c.weight()
        out.append((f(1),))
    for i in range(m // 2 - pp + half + 1):
        out += [(f(0),), (b(1),)] if i == 0 and middle else [(f(0), b(1))]
        out.append((f(1), b(0)))
    for _ in range(halves - half - 1):
        out += [(b(1),), (f(1), b(0))]
    split = False
    for i in range(half + 1):
        split = split or (i == (half + 1) // 2 and half % 2 == 1)
        out.append((b(1, split),))
        split = split or (i == (half + 1) // 2 and half % 2 == 0)
        out.append((b(0, split),))
    for _ in range(halves - half - 1):
        out += c.weight()
        out.append((b(0, True),))
    for _ in range(half + 1):
        out += c.weight()
    return out


def _combined(pp: int, vpp: int, m: int, rank: int) -> list[Step]:
    """Megatron's combined 1F1B (``--overlap-moe-expert-parallel-comm``): the 1F1B order
    (interleaved with ``vpp > 1``) with one more warm-up forward (``get_pp_rank_microbatches``
    L966-970) and each steady-state forward issued together with a backward
    (``combined_1f1b_schedule_for_interleaved_pipelining``; with ``pp == 1``
    ``combined_1f1b_schedule_for_no_pipelining``, combined_1f1b.py L35-135: F0, then F(i+1) with
    B(i), then the last B)."""
    total = m * vpp
    warm = min(2 * (pp - rank - 1) + (vpp - 1) * pp + 1, total)
    chunks = megatron_chunks(m, vpp, pp)
    seen_f, seen_b = [0] * vpp, [0] * vpp
    forwards: list[Op] = []
    backwards: list[Op] = []
    for chunk in chunks:
        forwards.append(("F", chunk * pp + rank, seen_f[chunk]))
        seen_f[chunk] += 1
        back = vpp - 1 - chunk
        backwards.append(("B", back * pp + rank, seen_b[back]))
        seen_b[back] += 1
    steps: list[Step] = [(op,) for op in forwards[:warm]]
    steady = total - warm
    steps += [(forwards[warm + k], backwards[k]) for k in range(steady)]
    return steps + [(op,) for op in backwards[steady:]]


ORDERS: dict[str, Callable[[int, int, int, int], list[Step]]] = {
    "gpipe": _gpipe,
    "looped-bfs": _looped_bfs,
    "zb-h1": _zb_h1,
    "zb-v": _zb_v,
    "dualpipe-v": _dualpipe_v,
    "combined-1f1b": _combined,
    "dualpipe": _dualpipe,
}
"""Every simulated order but ``1f1b``, which is ``_one_f_one_b`` or ``_interleaved`` by vpp."""


@functools.lru_cache(maxsize=256)
def rank_steps(schedule: str, pp: int, vpp: int, m: int) -> tuple[tuple[Step, ...], ...]:
    """Each rank's steps for ``m`` micro-batches (module docstring)."""
    one_f_one_b = _one_f_one_b if vpp == 1 else _interleaved
    order = one_f_one_b if schedule == "1f1b" else ORDERS[schedule]
    return tuple(tuple(order(pp, vpp, m, rank)) for rank in range(pp))


def pipeline_length(schedule: str, pp: int, vpp: int) -> int:
    """Stages a micro-batch passes through: ``pp*vpp``, or ``pp`` per direction in DualPipe."""
    return pp if schedule == "dualpipe" else pp * vpp


def chunk_stage(schedule: str, pp: int, vpp: int, rank: int, chunk: int) -> int:
    """The global stage of ``rank``'s ``chunk`` (``chunk_of`` inverted; the placement is
    ``autopar.layout.stages.placed_chunks``)."""
    return placed_chunks(pp, vpp, rank, placement_of(schedule))[chunk]


def chunk_of(schedule: str, pp: int, vpp: int, stage: int) -> tuple[int, int]:
    """``(rank, chunk)`` of a global stage (module docstring)."""
    if schedule == "dualpipe":
        direction, k = divmod(stage, pp)
        return (k, 0) if direction == 0 else (pp - 1 - k, 1)
    return chunk_place(pp, stage, placement_of(schedule))
