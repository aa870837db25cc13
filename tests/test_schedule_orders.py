"""Each simulated schedule's operation order (``autopar.costs.schedule_orders``) against the
framework's own: ``torch.distributed.pipelining`` builds its schedule tables on the CPU
(``_schedule_visualizer.get_schedule_ops`` mocks the stages), Megatron's interleaved order is
``autopar.costs.schedule.rank_ops`` (its own test checks it against ``schedules.py``), and
DeepSeek's DualPipe the published memory per device (DualPipe README, DeepSeek-V3 Table 2)."""

from __future__ import annotations

import pytest

from autopar.base.axes import PIPELINE_SCHEDULES
from autopar.costs.schedule import rank_ops
from autopar.costs.schedule_orders import PAIRED, rank_steps
from autopar.costs.schedule_slots import in_flight_chunks, orderable
from autopar.outputs.emit.torchtitan import TORCHTITAN_SCHEDULES


def _torch_steps(name: str, pp: int, m: int, vpp: int) -> list[list[tuple]]:
    # imported here, not at the top: collecting this module imported torch (4 s of CPU) in
    # every pytest worker, and only the one running these tests needs it
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    single = name in ("1F1B", "GPipe")
    actions = get_schedule_ops(name, pp, m, None if single else vpp)
    out = []
    for rank in actions:
        steps = []
        for a in rank:
            if a is None or a.computation_type.value not in ("F", "B", "I", "W", "OVERLAP_F_B"):
                continue
            subs = a.sub_actions or (a,)
            steps.append(
                tuple((s.computation_type.value, s.stage_index, s.microbatch_index) for s in subs)
            )
        out.append(steps)
    return out


def _cases():
    """Every torchtitan schedule at small shapes: warm-up-bound (m < pp), whole rounds, partial
    rounds (torch's ``m // pp`` rounds), and the 1F1B ranks with and without interleaving."""
    for schedule, name in TORCHTITAN_SCHEDULES.items():
        single = name in ("1F1B", "GPipe")
        vpps = (1, 2) if schedule == "1f1b" else (1,) if single else (2,)
        for vpp in vpps:
            torch_name = "Interleaved1F1B" if schedule == "1f1b" and vpp > 1 else name
            for pp, m in ((2, 1), (3, 7), (4, 3), (4, 12)):
                yield schedule, torch_name, pp, vpp, m
    yield "zb-h1", "InterleavedZeroBubble", 4, 3, 8
    yield "1f1b", "Interleaved1F1B", 3, 3, 9


@pytest.mark.xdist_group("torch")  # the worker that imports torch for the consumers (conftest)
@pytest.mark.parametrize(("schedule", "torch_name", "pp", "vpp", "m"), list(_cases()))
def test_orders_are_torchs(schedule, torch_name, pp, vpp, m):
    try:
        expected = _torch_steps(torch_name, pp, m, vpp)
    except ValueError:  # a micro-batch count the schedule refuses (rules.py has the rule)
        return
    mine = [list(steps) for steps in rank_steps(schedule, pp, vpp, m)]
    if torch_name == "1F1B":
        # Schedule1F1B._get_pipeline_order numbers the last rank's forwards from 1 (a bug of
        # the table only: _step_microbatches runs F0 first); every other rank must match.
        expected, mine = expected[:-1], mine[:-1]
    assert mine == expected


@pytest.mark.parametrize(
    ("pp", "vpp", "m"), [(2, 1, 4), (4, 1, 9), (4, 2, 8), (3, 3, 9), (4, 4, 12)]
)
def test_megatron_orders_are_the_1f1b_ones(pp, vpp, m):
    """Megatron's 1F1B and interleaved orders (``rank_ops``: micro-batch, chunk) equal torch's
    (stage = chunk * pp + rank) when the micro-batches fill whole groups of ``pp``."""
    for rank in range(pp):
        megatron = [(kind, c * pp + rank, b) for kind, b, c in rank_ops(pp, vpp, m, rank)]
        assert [step[0] for step in rank_steps("1f1b", pp, vpp, m)[rank]] == megatron


def _peak(schedule: str, pp: int, vpp: int, m: int) -> int:
    """The most micro-batch chunks one rank holds at its peak (``in_flight_chunks``)."""
    return max(sum(rank) for rank in in_flight_chunks(schedule, pp, vpp, m))


@pytest.mark.parametrize("pp", [4, 8])
def test_memory_per_device_is_deepseeks_table(pp):
    """DeepSeek-V3 report Table 2 / DualPipe README: activations per device PP for 1F1B and
    ZB1P, PP+1 for DualPipe (in micro-batch-stages); DualPipeV on PP/2 devices holds PP+1
    chunks (of PP stages)."""
    m = 4 * pp
    assert _peak("1f1b", pp, 1, m) == pp
    assert _peak("zb-h1", pp, 1, m) == pp
    assert _peak("dualpipe", pp, 1, m) == pp + 1
    assert _peak("dualpipe-v", pp // 2, 2, m) == pp + 1


@pytest.mark.parametrize("schedule", PIPELINE_SCHEDULES)
def test_paired_names_the_schedules_with_two_operation_steps(schedule):
    """``PAIRED`` is exactly the schedules whose orders issue a forward with a backward (the
    per-stage costs skip the paired hiding for the others)."""
    pp, vpp = 4, 1 if schedule in ("gpipe", "dualpipe") else 2
    m = 16
    assert orderable(schedule, pp, vpp, m), "every schedule has an order at this shape"
    steps = [step for rank in rank_steps(schedule, pp, vpp, m) for step in rank]
    assert any(len(step) == 2 for step in steps) == (schedule in PAIRED)
