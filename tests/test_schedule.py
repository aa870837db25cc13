"""The simulated pipeline schedules (``autopar.costs.schedule``) against Megatron's own examples and
the closed forms that hold for equal stages."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.costs.schedule import rank_ops, schedule_chunks, simulate_step_s


def test_schedule_table_is_megatrons_example():
    """``schedules.py`` comment above ``get_schedule_table``: PP2 N3M5 with VP2 runs chunks
    0 0 0 1 1 1 0 0 1 1 (groups of 3 micro-batches, the last group of 2)."""
    assert schedule_chunks(5, 2, 3) == (0, 0, 0, 1, 1, 1, 0, 0, 1, 1)


@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 8), (4, 2, 8), (3, 3, 9)])
def test_every_rank_runs_each_operation_once_warmup_first(p, v, m):
    for rank in range(p):
        ops = rank_ops(p, v, m, rank)
        assert sorted(ops) == sorted(
            (kind, b, c) for kind in "FB" for b in range(m) for c in range(v)
        )
        warmup = min(p - rank - 1 if v == 1 else 2 * (p - rank - 1) + (v - 1) * p, m * v)
        assert [kind for kind, _, _ in ops[: warmup + 1]] == ["F"] * (warmup + 1)


@pytest.mark.parametrize(("p", "v", "m"), [(1, 1, 3), (4, 1, 8), (4, 2, 8), (8, 4, 32)])
def test_equal_stages_give_narayanans_step(p, v, m):
    """Equal chunks: ``(m + (p-1)/v) * t`` (Narayanan et al. 2021 §2.2.2), ``t`` one
    micro-batch's forward + backward on a stage."""
    forward = np.full((p, v), 0.1)
    step = simulate_step_s(forward, 2 * forward, m)
    assert step == pytest.approx((m + (p - 1) / v) * 0.3 * v, rel=1e-12)


def test_step_is_monotone_and_at_least_each_ranks_work():
    rng = np.random.default_rng(3)
    for _ in range(20):
        p, v = int(rng.integers(2, 6)), int(rng.integers(1, 4))
        m = p * int(rng.integers(1, 4))
        forward, backward = rng.uniform(0.1, 1, (p, v)), rng.uniform(0.2, 2, (p, v))
        step = simulate_step_s(forward, backward, m)
        assert step >= m * (forward + backward).sum(axis=1).max() * (1 - 1e-12)
        slower = forward.copy()
        slower[rng.integers(p), rng.integers(v)] *= 1.5
        assert simulate_step_s(slower, backward, m) >= step * (1 - 1e-12)
