"""The pipeline schedules a per-stage plan runs (``autopar.costs.schedule.PipelineSchedule``).

Megatron's 1F1B and interleaved 1F1B (and the combined 1F1B, whose pairs' hiding the per-stage
costs already charge: ``autopar.costs.stage_costs``) are ``MEGATRON``, torch's the same where
the two orders agree (``OneFOneB``). torch's loop-style schedules that run a whole backward,
GPipe and Looped BFS (and torch's interleaved 1F1B elsewhere), are ``LoopSchedule``: the same
order, slots, peak and simulation the uniform plan is priced with
(``autopar.costs.schedule_orders``, ``schedule_slots``, ``schedule.simulate``), no second copy.
All put virtual stage ``q`` on rank ``q % pp`` (``StagePlan.placement`` ``loop``).

ZB-H1 (``ZeroBubble``) runs each chunk's backward as its input gradient and its weight
gradient (``autopar.costs.stage_costs.StageCosts.weight_s``). So do the V schedules, ZB-V and
DualPipeV (``ZeroBubble`` too), whose plans are V-placed (``StagePlan.placement`` ``v``: chunks
``r`` and ``2*pp-1-r`` on rank ``r``): the figures are summed per rank over those two chunks
(``autopar.costs.stage_figures``), so the slowest rank, the peak memory (each chunk's
activations times its in-flight count from the schedule's own order, ``in_flight_chunks``;
rank 0 holds the embedding and the output layer) and the simulation
(``autopar.costs.schedule.simulate``, whose ``(rank, local chunk)`` grid is the V's) see the
V's chunk pairs. DualPipeV holds no second copy of the parameters: DualPipe's two copies
(DeepSeek-V3 report §3.2.1, Table 2: parameters 2x) are what its "cut-in-half" V turns into
a rank's two chunks (deepseek-ai/DualPipe ``dualpipev.py``; torch ``ScheduleDualPipeV`` runs
the rank's two stage modules that torchtitan's ``pipeline_module_split`` builds, one each).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from autopar.base.errors import InputError
from autopar.costs.schedule import MEGATRON, PipelineSchedule, simulate
from autopar.costs.schedule_slots import in_flight_chunks, schedule_slots

NOMINAL_RATIO = (1.0 / 3.0, 2.0 / 3.0, 0.0, 0.0)
"""Phase shares the slots are read at (forward, whole backward as the input gradient, no
separate weight gradient, nothing hidden): the per-stage figures' backward twice the forward
(``autopar.costs.stage_figures.FORWARD_SHARE``)."""


@functools.lru_cache(maxsize=4096)
def _slots(name: str, pp: int, vpp: int, m: int) -> Fraction:
    """Stage-sized micro-batch slots of the pipeline for equal stages (``schedule_slots`` at
    ``NOMINAL_RATIO``: ``sF/3 + 2*sI/3``), as a fraction: the slots are multiples of
    ``1/(pp*vpp)`` (operations on the longest path count ``1/vpp``, the steady-state line
    steps by ``1/pp``), so the closest fraction with that denominator (times 3) is exact."""
    forward, backward, _, _ = schedule_slots(name, pp, vpp, m, NOMINAL_RATIO)
    value = forward * NOMINAL_RATIO[0] + backward * NOMINAL_RATIO[1]
    return Fraction(value).limit_denominator(3 * pp * vpp)


@functools.lru_cache(maxsize=65536)
def _float_weights(schedule, pp: int, vpp: int, m: int) -> tuple[float, float]:
    """``(a, d)`` of ``schedule.step_weights`` as floats (``_weighted_pipeline_s``)."""
    a, b = schedule.step_weights(pp, vpp, m)
    return float(a), float(1 / b)


def _weighted_pipeline_s(schedule, slowest_s, total_s, num_microbatches, *, pp: int, vpp: int):
    """``a * slowest + total / d`` with ``(a, 1/d)`` the schedule's ``step_weights`` per
    micro-batch count (``d`` is ``vpp`` or ``3*vpp``: one count's weights are computed once)."""
    m = np.asarray(num_microbatches, dtype=np.int64)
    if m.size and (m == m.flat[0]).all():  # one count: its weights filled in, the same floats
        weight, divide = _float_weights(schedule, pp, vpp, int(m.flat[0]))
        a, divisor = np.full(m.shape, weight), np.full(m.shape, divide)
    else:
        distinct, where = np.unique(m, return_inverse=True)
        weights = np.array([_float_weights(schedule, pp, vpp, int(x)) for x in distinct])
        a, divisor = (weights[:, k][where.reshape(m.shape)] for k in (0, 1))
    return a * np.asarray(slowest_s) + np.asarray(total_s) / divisor


@dataclass(frozen=True, slots=True)
class LoopSchedule:
    """A torch loop-style schedule with whole backwards (``gpipe``, ``looped-bfs``, ``1f1b``).
    Closed form ``(s - pp/v) * max_i T_i + sum_i T_i / v``, ``s`` the schedule's slots for equal
    stages (``_slots``: GPipe ``m + pp - 1``, Huang et al. 2019 §2.2; Looped BFS ``m +
    (pp-1)/v``, Lamy-Poirier 2023 §4): one pass of the first micro-batch through every stage
    and the rest of the slots at the slowest stage, the form ``MegatronSchedule`` has for 1F1B.
    Equal to the uniform plan's pipeline for equal stages."""

    name: str

    def in_flight(self, pp: int, vpp: int, num_microbatches: int, stage: int) -> tuple[int, ...]:
        return in_flight_chunks(self.name, pp, vpp, int(num_microbatches))[stage]

    def step_weights(self, pp: int, vpp: int, num_microbatches: int) -> tuple[Fraction, Fraction]:
        slots = _slots(self.name, pp, vpp, int(num_microbatches))
        return max(Fraction(0), slots - Fraction(pp, vpp)), Fraction(1, vpp)

    def pipeline_s(self, slowest_s, total_s, num_microbatches, *, pp: int, vpp: int) -> np.ndarray:
        return _weighted_pipeline_s(self, slowest_s, total_s, num_microbatches, pp=pp, vpp=vpp)

    def simulate_s(self, forward_s, backward_s, num_microbatches: int, *, weight_s=None) -> float:
        fwd = np.asarray(forward_s, dtype=np.float64)
        pp, vpp = fwd.shape
        step = simulate(self.name, pp, vpp, int(num_microbatches), fwd, backward_s, 0.0)
        return step.step_s


ZERO_BUBBLE_RATIO = (1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0)
"""Phase shares a zero-bubble schedule is ranked at: the forward a third (``NOMINAL_RATIO``)
and the backward split evenly into input and weight gradients, ``T_F = T_B = T_W`` (Qi et al.
2024 §2, the assumption ZB-H1's bubble ``(p-1)(T_F + T_B - T_W)`` is stated under, §3.1)."""


@functools.lru_cache(maxsize=4096)
def _zero_bubble_slots(name: str, pp: int, vpp: int, m: int) -> Fraction:
    """Stage-sized micro-batch slots of a zero-bubble schedule for equal stages at
    ``ZERO_BUBBLE_RATIO`` (``schedule_slots``: ``(sF + sI + sW)/3``; ZB-H1 with ``m >= pp``,
    ``m + (pp-1)/(3*vpp)``), a fraction of denominator ``3*vpp`` (``_slots``)."""
    forward, input_grad, weight, _ = schedule_slots(name, pp, vpp, m, ZERO_BUBBLE_RATIO)
    value = (forward + input_grad + weight) / 3.0
    return Fraction(value).limit_denominator(3 * pp * vpp)


@dataclass(frozen=True, slots=True)
class ZeroBubble:
    """A schedule that runs each backward as an input gradient and, later, a weight gradient
    filling the bubble (``zb-h1``: torch's ``ScheduleInterleavedZeroBubble``, Qi et al. 2024
    §3.1). Ranked by ``(s - pp/(3v)) * max_i T_i + sum_i T_i / (3v)``, ``s`` its slots at
    ``ZERO_BUBBLE_RATIO`` (``_zero_bubble_slots``): the slowest stage runs every micro-batch
    and the bubble is the others' ``T_F + T_B - T_W``, a third of ``T`` at that ratio. For
    equal stages that is the least bubble of any ratio (``max(F, B, F + B - W)`` over ``F + B +
    W = T`` is least, ``T/3``, at ``F = B = W``), so the formula is at most the uniform plan's
    pipeline, which reads the slots at the layout's own phase times, as the simulation here does
    (``simulate_s``: the schedule's own order over each chunk's forward, input and weight
    gradient). The V schedules (``zb-v``, ``dualpipe-v``) take the same form, their slots the
    critical path of their order simulated at ``ZERO_BUBBLE_RATIO`` (``schedule_slots``): exact
    there for equal stages, but no bound at other phase times (ZB-V's formula is 1.6% above its
    simulation on Llama-3 70B, PP 2; DualPipeV's 2% below at PP 8), so their answers are
    simulated too (``autopar.pipeline.result``)."""

    name: str

    def in_flight(self, pp: int, vpp: int, num_microbatches: int, stage: int) -> tuple[int, ...]:
        return in_flight_chunks(self.name, pp, vpp, int(num_microbatches))[stage]

    def step_weights(self, pp: int, vpp: int, num_microbatches: int) -> tuple[Fraction, Fraction]:
        slots = _zero_bubble_slots(self.name, pp, vpp, int(num_microbatches))
        return max(Fraction(0), slots - Fraction(pp, 3 * vpp)), Fraction(1, 3 * vpp)

    def pipeline_s(self, slowest_s, total_s, num_microbatches, *, pp: int, vpp: int) -> np.ndarray:
        return _weighted_pipeline_s(self, slowest_s, total_s, num_microbatches, pp=pp, vpp=vpp)

    def simulate_s(self, forward_s, backward_s, num_microbatches: int, *, weight_s=None) -> float:
        fwd = np.asarray(forward_s, dtype=np.float64)
        pp, vpp = fwd.shape
        weight = np.zeros_like(fwd) if weight_s is None else np.asarray(weight_s, np.float64)
        input_grad = np.asarray(backward_s, dtype=np.float64) - weight
        return simulate(self.name, pp, vpp, int(num_microbatches), fwd, input_grad, weight).step_s


def _torch_rounds(pp: int, vpp: int, m: int) -> bool:
    """Whether torch's interleaved 1F1B differs from Megatron's order here: with virtual
    stages it runs rounds of ``m // max(1, m // pp)`` micro-batches (``ScheduleInterleaved1F1B
    .__init__``, L3192-3198), Megatron groups of ``pp``; they agree when ``pp`` divides ``m``,
    which Megatron requires (``autopar.layout.rules``), so only torchtitan's plans get here."""
    return vpp > 1 and m % pp != 0


_TORCH_1F1B = LoopSchedule("1f1b")


@dataclass(frozen=True, slots=True)
class OneFOneB:
    """1F1B and interleaved 1F1B, Megatron's and torch's: ``MEGATRON`` wherever the two orders
    agree (``_torch_rounds``), else torch's order (``LoopSchedule("1f1b")``: its slots add
    ``(pp - m)*(vpp-1)/vpp`` below ``pp`` micro-batches, ``schedule_slots._closed_slots``). One
    object for ``1f1b`` and ``combined-1f1b``, so their rows stay one shape."""

    name: str = "megatron"

    def in_flight(self, pp: int, vpp: int, num_microbatches: int, stage: int) -> tuple[int, ...]:
        if _torch_rounds(pp, vpp, int(num_microbatches)):
            return _TORCH_1F1B.in_flight(pp, vpp, num_microbatches, stage)
        return MEGATRON.in_flight(pp, vpp, num_microbatches, stage)

    def step_weights(self, pp: int, vpp: int, num_microbatches: int) -> tuple[Fraction, Fraction]:
        if _torch_rounds(pp, vpp, int(num_microbatches)):
            return _TORCH_1F1B.step_weights(pp, vpp, num_microbatches)
        return MEGATRON.step_weights(pp, vpp, num_microbatches)

    def pipeline_s(self, slowest_s, total_s, num_microbatches, *, pp: int, vpp: int) -> np.ndarray:
        out = MEGATRON.pipeline_s(slowest_s, total_s, num_microbatches, pp=pp, vpp=vpp)
        m = np.asarray(num_microbatches, dtype=np.int64)
        short = (vpp > 1) & (m % pp != 0) & (m < pp)  # elsewhere the weights are Megatron's
        if not np.any(short):
            return out
        torch = _TORCH_1F1B.pipeline_s(slowest_s, total_s, num_microbatches, pp=pp, vpp=vpp)
        return np.where(short, torch, out)

    def simulate_s(self, forward_s, backward_s, num_microbatches: int, *, weight_s=None) -> float:
        pp, vpp = np.shape(forward_s)
        if _torch_rounds(pp, vpp, int(num_microbatches)):
            return _TORCH_1F1B.simulate_s(forward_s, backward_s, num_microbatches)
        return MEGATRON.simulate_s(forward_s, backward_s, num_microbatches)


ONE_F_ONE_B = OneFOneB()

STAGE_SCHEDULES: dict[str, PipelineSchedule] = {
    "1f1b": ONE_F_ONE_B,
    "combined-1f1b": ONE_F_ONE_B,
    "gpipe": LoopSchedule("gpipe"),
    "looped-bfs": LoopSchedule("looped-bfs"),
    "zb-h1": ZeroBubble("zb-h1"),
    "zb-v": ZeroBubble("zb-v"),
    "dualpipe-v": ZeroBubble("dualpipe-v"),
}
"""The schedule each per-stage plan of that ``Layout.pipeline_schedule`` is priced with (the
combined 1F1B's pair hiding is in the per-stage costs, ``autopar.costs.stage_costs``)."""

LOWER_BOUND_FORMULAS: frozenset[str] = frozenset({"zb-h1", "zb-v", "dualpipe-v"})
"""Schedules whose formula is not exact for equal stages at the layout's phase times
(``ZeroBubble``: read at ``ZERO_BUBBLE_RATIO``), so the answers are closed by simulation
(``autopar.pipeline.result``); the others' closed forms are exact there, at their one ratio."""

STAGE_REFUSALS: dict[str, str] = {}
"""Why each schedule outside ``STAGE_SCHEDULES`` has no per-stage plan (none left)."""


def stage_schedule(name: str) -> PipelineSchedule:
    """The per-stage schedule of ``Layout.pipeline_schedule`` ``name`` (``STAGE_SCHEDULES``);
    ``InputError`` naming the reason for one that has none (``STAGE_REFUSALS``)."""
    if name not in STAGE_SCHEDULES:
        raise InputError(
            f"the {name} schedule has no per-stage plan: {STAGE_REFUSALS.get(name, 'unpriced')}; "
            f"per-stage plans run {', '.join(STAGE_SCHEDULES)}",
            source="--pipeline-schedule",
        )
    return STAGE_SCHEDULES[name]
