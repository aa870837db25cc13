"""The schedules' slots and activation peaks (``autopar.costs.schedule``) against the simulation
they come from, the papers' closed forms, and the claims the search restrictions rest on."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.costs.schedule import _schedule_graph, simulate
from autopar.costs.schedule_slots import (
    EXTRAPOLATE_ABOVE,
    SEQUENTIAL_PAIRS,
    STEADY_FROM,
    _closed_in_flight,
    _closed_slots,
    _held_at_peak,
    in_flight_chunks,
    orderable,
    ratio_free,
    schedule_slots,
)

RNG = np.random.default_rng(20261201)


def _ratio():
    """Phase times of one micro-batch as the cost terms give them: a forward, an input-gradient
    backward from half to three times it, a weight gradient up to 1.5 times it."""
    return (1.0, float(RNG.uniform(0.5, 3.0)), float(RNG.uniform(0.1, 1.5)), 0.0)


def _step(schedule, pp, vpp, m, ratio):
    f, b, w, h = (x / vpp for x in ratio)
    return simulate(schedule, pp, vpp, m, f, b, w, pair_hidden_s=h).step_s


def _form(slots, ratio):
    return sum(s * r for s, r in zip(slots[:3], ratio[:3], strict=True)) - slots[3] * ratio[3]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "looped-bfs", "zb-h1"])
def test_closed_forms_are_the_simulation(schedule):
    checked = 0
    for pp in range(1, 7):
        for vpp in (1,) if schedule == "gpipe" else (1, 2, 3):
            for m in range(1, 3 * pp + 2):
                ratio = _ratio()
                closed = _closed_slots(schedule, pp, vpp, m, ratio)
                if closed is None or not orderable(schedule, pp, vpp, m):
                    continue
                checked += 1
                step = _step(schedule, pp, vpp, m, ratio)
                assert _form(closed, ratio) == pytest.approx(step, rel=1e-12), (pp, vpp, m)
    assert checked > 40


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v", "combined-1f1b", "zb-h1"])
def test_slots_bound_the_step_from_below_and_meet_it_at_their_times(schedule):
    """``schedule_slots`` at some phase times is a path of the schedule's graph: at other times
    it is at most the simulated step (what the solver's lower bound needs), at its own exact."""
    for pp in (2, 3, 4):
        for m in (pp, 2 * pp + 1, 4 * pp):
            vpp = 2
            if not orderable(schedule, pp, vpp, m):
                continue
            ratio = (*_ratio()[:3], 0.3 if schedule == "combined-1f1b" else 0.0)
            slots = schedule_slots(schedule, pp, vpp, m, ratio)
            assert _form(slots, ratio) == pytest.approx(_step(schedule, pp, vpp, m, ratio))
            for _ in range(4):
                other = (*_ratio()[:3], ratio[3])
                assert _form(slots, other) <= _step(schedule, pp, vpp, m, other) * (1 + 1e-12)


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v", "combined-1f1b"])
def test_many_microbatches_extend_the_steady_state(schedule):
    """From ``STEADY_FROM * pp`` micro-batches on the slots are taken on the line through two
    simulations: equal to simulating them all."""
    pp, vpp = 3, 2
    for m in (STEADY_FROM * pp + 1, STEADY_FROM * pp + pp + 2, 5 * pp + 3):
        if not orderable(schedule, pp, vpp, m):
            continue
        ratio = (*_ratio()[:3], 0.2)
        f, b, w, h = (x / vpp for x in ratio)
        direct = simulate(schedule, pp, vpp, m, f, b, w, pair_hidden_s=h, critical=True)
        slots = schedule_slots(schedule, pp, vpp, m, ratio)
        assert _form(slots, ratio) == pytest.approx(direct.step_s, rel=1e-12)


@pytest.mark.parametrize("schedule", ["1f1b", "combined-1f1b", "zb-h1", "zb-v", "dualpipe-v"])
def test_in_flight_closed_forms_are_the_orders_peaks(schedule):
    checked = 0
    for pp in range(1, 7):
        for vpp in (1, 2, 3):
            for m in range(1, 3 * pp + 3):
                if not orderable(schedule, pp, vpp, m):
                    continue
                closed = [_closed_in_flight(schedule, pp, vpp, m, r) for r in range(pp)]
                if None in closed:
                    continue
                checked += 1
                steps = _schedule_graph(schedule, pp, vpp, m).steps
                sequential = schedule in SEQUENTIAL_PAIRS
                assert tuple(closed) == tuple(
                    _held_at_peak(a, vpp, sequential_pairs=sequential) for a in steps
                ), (pp, vpp, m)
    assert checked > 20


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipe-v", "zb-h1"])
def test_the_peak_stops_growing_past_the_warm_up(schedule):
    pp, vpp = 3, 2
    small = in_flight_chunks(schedule, pp, vpp, EXTRAPOLATE_ABOVE * pp)
    steps = _schedule_graph(schedule, pp, vpp, 6 * pp).steps
    sequential = schedule in SEQUENTIAL_PAIRS
    assert small == tuple(_held_at_peak(a, vpp, sequential_pairs=sequential) for a in steps)


def test_papers_bubbles_at_equal_phase_times():
    """With T_F = T_B = T_W (sail-sg README table; DualPipe README = DeepSeek-V3 Table 2, B a
    whole backward, F&B a forward and a backward issued together with nothing hidden): 1F1B
    (p-1)(F+B), ZB1P (p-1)(F+B-2W) (a third of 1F1B's), DualPipe (p/2-1)(F&B+B-3W), and
    ZB-V zero within each rank's span (the makespan adds the last rank's late start)."""
    for pp in (4, 8):
        m = 4 * pp
        work = 3.0 * m
        t = 1.0
        cases = {
            "1f1b": (1, (pp - 1) * (t + 2 * t)),
            "zb-h1": (1, (pp - 1) * (t + 2 * t - 2 * t)),
            "dualpipe": (1, (pp / 2 - 1) * (3 * t + 2 * t - 3 * t)),
        }
        for schedule, (vpp, bubble) in cases.items():
            assert simulate(schedule, pp, vpp, m, t, t, t).step_s - work == pytest.approx(bubble)
        zbv = simulate("zb-v", pp, 2, m, t / 2, t / 2, t / 2)
        assert max(end - start for start, end in zbv.spans) == pytest.approx(work)
        assert zbv.step_s - work == pytest.approx((pp - 1) * t / 2)


def test_dominated_schedules_are_never_faster():
    """The search restrictions (``schedule_rules._dominated_rules``): Looped BFS never beats the
    interleaved 1F1B where both run, torchtitan's DualPipeV never beats ZB-V; GPipe's slots are
    1F1B's (closed forms) with more held."""
    for _ in range(150):
        pp, vpp = int(RNG.integers(2, 7)), int(RNG.integers(2, 4))
        m = int(RNG.integers(1, 4 * pp))
        ratio = _ratio()
        if orderable("1f1b", pp, vpp, m):
            bfs, interleaved = (_step(s, pp, vpp, m, ratio) for s in ("looped-bfs", "1f1b"))
            assert bfs >= interleaved * (1 - 1e-12)
            held = (sum(r) for r in in_flight_chunks("looped-bfs", pp, vpp, m))
            assert min(held) >= max(sum(r) for r in in_flight_chunks("1f1b", pp, vpp, m))
        m = max(m, 2 * pp)
        dualpipe, zbv = (_step(s, pp, 2, m, ratio) for s in ("dualpipe-v", "zb-v"))
        assert dualpipe >= zbv * (1 - 1e-12)
        assert max(map(sum, in_flight_chunks("dualpipe-v", pp, 2, m))) >= max(
            map(sum, in_flight_chunks("zb-v", pp, 2, m))
        )
        assert _closed_slots("gpipe", pp, 1, m, ratio) == _closed_slots("1f1b", pp, 1, m, ratio)


def test_the_combined_1f1b_closed_form_is_the_simulation_at_any_times():
    """Every phase at the interleaved slots, ``pp`` fewer pairs on the path than slots: the
    simulation's own longest path at random phase and hidden times (``ratio_free``)."""
    checked = 0
    for pp in range(1, 6):
        for vpp in (1, 2, 3, 4) if pp == 1 else (2, 3, 4):
            for m in range(pp, 4 * pp + 1, pp):
                f, b, w = (float(x) for x in RNG.uniform(0.2, 2.0, size=3))
                ratio = (f, b, w, float(RNG.uniform(0.0, 0.9)) * min(f, b + w))
                closed = _closed_slots("combined-1f1b", pp, vpp, m, ratio)
                assert closed is not None and ratio_free("combined-1f1b", pp, vpp, m)
                step = _step("combined-1f1b", pp, vpp, m, ratio)
                assert _form(closed, ratio) == pytest.approx(step, rel=1e-12), (pp, vpp, m)
                checked += 1
    assert checked > 40
    assert not ratio_free("zb-h1", 4, 2, 8) and not ratio_free("zb-v", 4, 2, 8)


def test_the_combined_1f1b_dominates_1f1b_where_both_run():
    """The search restriction ``1f1b only where combined-1f1b is refused``: the same slots for
    every phase as the interleaved 1F1B, paired slots >= 0 (so never slower), and the same
    activation peak on every rank."""
    for pp in range(1, 7):
        for vpp in (1,) if pp == 1 else (2, 3):
            for m in range(pp, 3 * pp + 1, pp):
                ratio = _ratio()
                combined = _closed_slots("combined-1f1b", pp, vpp, m, ratio)
                plain = _closed_slots("1f1b", pp, vpp, m, ratio)
                assert combined[:3] == pytest.approx(plain[:3]) and combined[3] >= 0
                assert in_flight_chunks("combined-1f1b", pp, vpp, m) == in_flight_chunks(
                    "1f1b", pp, vpp, m
                )
