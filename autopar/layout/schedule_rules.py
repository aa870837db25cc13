"""The rules of the pipeline-schedule axis (``autopar.base.axes`` ``schedule``), per framework,
each with the line of the framework that raises on it (``autopar.layout.rules`` includes them).

Which framework ships which schedule is ``autopar.inputs.frameworks.FRAMEWORK_SCHEDULES``; the
constraints below are the ones each schedule's own code raises on (torch 2.14
``torch/distributed/pipelining/schedules.py``, torchtitan ``distributed/pipeline_parallel.py``,
Megatron-LM main ``megatron/core/transformer/transformer_config.py`` and
``pipeline_parallel/schedules.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autopar.base.axes import PIPELINE_SCHEDULES, RECOMPUTE_MODES
from autopar.inputs.frameworks import FRAMEWORK_SCHEDULES
from autopar.inputs.specs import Problem
from autopar.layout.rule import Rule

Grid = Mapping[str, np.ndarray]
CODE: dict[str, int] = {name: i for i, name in enumerate(PIPELINE_SCHEDULES)}
FAMILY = "pipeline schedule"
SEARCH_FAMILY = "pipeline schedule search"
"""The search restrictions among the schedules (a dominated schedule is not searched beside
the one that dominates it); a layout given to evaluate is not held to them."""


def _is(g: Grid, *names: str) -> np.ndarray:
    """Where the schedule is one of ``names`` (a lookup by code: the rules run over millions
    of scoring keys, where ``np.isin`` sorts)."""
    member = np.zeros(len(PIPELINE_SCHEDULES), dtype=bool)
    member[[CODE[n] for n in names]] = True
    return member[np.asarray(g["schedule"], dtype=np.int64)]


def _shape_rules() -> list[Rule]:
    """What each schedule needs of the pipeline, whatever runs it."""
    return [
        Rule(
            family=FAMILY,
            text="pp == 1 runs no pipeline schedule: 1f1b (or Megatron's combined-1f1b)",
            axes=("pp", "schedule"),
            check=lambda g: (g["pp"] > 1) | _is(g, "1f1b", "combined-1f1b"),
            source="Megatron schedules.py forward_backward_no_pipelining / "
            "combined_1f1b_schedule_for_no_pipelining (combined_1f1b.py L35)",
        ),
        Rule(
            family=FAMILY,
            text="gpipe runs one chunk per rank (vpp == 1)",
            axes=("vpp", "schedule"),
            check=lambda g: ~_is(g, "gpipe") | (g["vpp"] == 1),
            source="torchtitan pipeline_parallel.py L245-250 (single-stage schedule needs "
            "exactly 1 stage per rank)",
        ),
        Rule(
            family=FAMILY,
            text="looped-bfs and zb-h1 are multi-stage schedules: vpp >= 2",
            axes=("vpp", "schedule"),
            check=lambda g: ~_is(g, "looped-bfs", "zb-h1") | (g["vpp"] >= 2),
            source="torchtitan pipeline_parallel.py L252-257 (multi-stage schedule needs at "
            "least 2 stages per rank)",
        ),
        Rule(
            family=FAMILY,
            text="zb-v and dualpipe-v hold exactly two chunks per rank (vpp == 2)",
            axes=("vpp", "schedule"),
            check=lambda g: ~_is(g, "zb-v", "dualpipe-v") | (g["vpp"] == 2),
            source="torch schedules.py L3505-3509 (ZBV), L3691-3695 (DualPipeV): 'requires "
            "exactly 2 stages per rank'",
        ),
    ]


def _torchtitan_rules() -> list[Rule]:
    """The micro-batch counts torch's schedule classes refuse (ValueError)."""

    def rounds_ok(g: Grid) -> np.ndarray:
        m, pp = g["grad_accum"], g["pp"]
        return m % np.maximum(1, m // pp) == 0

    return [
        Rule(
            family=FAMILY,
            text="1F1B needs grad_accum >= pp",
            axes=("pp", "vpp", "grad_accum", "schedule"),
            check=lambda g: (
                ~(_is(g, "1f1b") & (g["vpp"] == 1) & (g["pp"] > 1)) | (g["grad_accum"] >= g["pp"])
            ),
            source="torch schedules.py L1231-1235 (Schedule1F1B: 'must be greater than or "
            "equal to the number of stages')",
        ),
        Rule(
            family=FAMILY,
            text="Interleaved1F1B / InterleavedZeroBubble: grad_accum % max(1, grad_accum // pp) "
            "== 0",
            axes=("pp", "vpp", "grad_accum", "schedule"),
            check=lambda g: ~((_is(g, "1f1b") & (g["vpp"] > 1)) | _is(g, "zb-h1")) | rounds_ok(g),
            source="torch schedules.py L3192-3198, L3305-3311 ('a multiple of the number of "
            "rounds')",
        ),
        Rule(
            family=FAMILY,
            text="DualPipeV needs grad_accum >= 2*pp (the stages)",
            axes=("pp", "grad_accum", "schedule"),
            check=lambda g: ~_is(g, "dualpipe-v") | (g["grad_accum"] >= 2 * g["pp"]),
            source="torch schedules.py L3697-3700 ('at least as many microbatches as stages')",
        ),
    ]


def _combined_ok(problem: Problem):
    """Where Megatron runs the combined 1F1B (``_combined_rules``), as a row predicate."""
    model, stack = problem.model, problem.training.stack
    full = RECOMPUTE_MODES.index("full")
    dispatchers = set(stack.moe_dispatchers) & {"alltoall", "flex"}
    applies = model.is_moe and model.num_mtp_layers <= 1 and bool(dispatchers)

    def ok(g: Grid) -> np.ndarray:
        shape = (g["ep"] > 1) & ((g["pp"] == 1) | (g["vpp"] > 1))
        return shape & (g["recompute"] != full) & applies

    return ok


def _combined_rules(problem: Problem) -> list[Rule]:
    """Megatron's ``--overlap-moe-expert-parallel-comm`` (the combined 1F1B)."""
    model, stack = problem.model, problem.training.stack
    full = RECOMPUTE_MODES.index("full")
    dispatchers = set(stack.moe_dispatchers) & {"alltoall", "flex"}
    applies = model.is_moe and model.num_mtp_layers <= 1 and bool(dispatchers)
    dominated = []
    if {"1f1b", "combined-1f1b"} <= set(problem.options.pipeline_schedules):
        combined_ok = _combined_ok(problem)
        dominated.append(
            Rule(
                family=SEARCH_FAMILY,
                text="1f1b only where combined-1f1b is refused (the combined 1F1B has 1F1B's "
                "slots and activations and hides part of the all-to-all)",
                axes=("pp", "vpp", "ep", "recompute", "schedule"),
                check=lambda g: ~_is(g, "1f1b") | ~combined_ok(g),
                source="autopar search restriction: same slots and memory, less time "
                "(tests/test_schedule_slots.py)",
                kind="default",
                lift="--pipeline-schedule 1f1b",
            )
        )
    return [
        *dominated,
        Rule(
            family=FAMILY,
            text="combined-1f1b needs expert layers (at most one MTP layer) and the alltoall or "
            "flex dispatcher",
            axes=("schedule",),
            check=lambda g: ~_is(g, "combined-1f1b") | applies,
            source="Megatron transformer_config.py L3016-3019 (alltoall/flex), L3043-3046 (MTP)",
        ),
        Rule(
            family=FAMILY,
            text="combined-1f1b needs ep > 1 and, with pp > 1, vpp > 1",
            axes=("pp", "vpp", "ep", "schedule"),
            check=lambda g: (
                ~_is(g, "combined-1f1b") | ((g["ep"] > 1) & ((g["pp"] == 1) | (g["vpp"] > 1)))
            ),
            source="Megatron transformer_config.py L3007-3015",
        ),
        Rule(
            family=FAMILY,
            text="combined-1f1b does not combine with full recompute",
            axes=("recompute", "schedule"),
            check=lambda g: ~_is(g, "combined-1f1b") | (g["recompute"] != full),
            source="Megatron transformer_config.py L3021-3023",
        ),
    ]


def _dominated_rules(problem: Problem) -> list[Rule]:
    """autopar search restrictions, not framework rules: a schedule whose simulated step is
    never shorter than another's on the same layout while it holds at least as much memory is
    searched only where the other is not allowed (``tests/test_schedule_slots.py`` checks each
    claim on random times and shapes). They apply only when the other is searched too."""
    allowed = set(problem.options.pipeline_schedules)
    source = (
        "autopar search restriction: same simulated step or longer, more activations held "
        "(tests/test_schedule_slots.py)"
    )

    def rounds_refused(g: Grid) -> np.ndarray:
        return g["grad_accum"] % np.maximum(1, g["grad_accum"] // g["pp"]) != 0

    table = [
        (
            {"gpipe", "1f1b"},
            "gpipe only where 1F1B refuses the micro-batch count (grad_accum < pp)",
            ("pp", "grad_accum", "schedule"),
            lambda g: ~_is(g, "gpipe") | (g["grad_accum"] < g["pp"]),
            source,
        ),
        (
            {"looped-bfs", "1f1b"},
            "looped-bfs only where Interleaved1F1B refuses the micro-batch count",
            ("pp", "grad_accum", "schedule"),
            lambda g: ~_is(g, "looped-bfs") | rounds_refused(g),
            source,
        ),
        (
            {"dualpipe-v", "zb-v"},
            "dualpipe-v is not searched beside zb-v (torchtitan runs its pairs one after the "
            "other, so it only reorders ZB-V's operations)",
            ("schedule",),
            lambda g: ~_is(g, "dualpipe-v"),
            source + "; torch schedules.py L2889-2894 (OVERLAP_F_B sub-actions in turn)",
        ),
    ]
    rules = [
        Rule(family=SEARCH_FAMILY, text=text, axes=axes, check=check, source=src, kind="default")
        for needs, text, axes, check, src in table
        if needs <= allowed
    ]
    return rules


def schedule_rules(problem: Problem) -> list[Rule]:
    """The schedule rules that apply to ``problem`` (module docstring)."""
    framework = problem.options.framework
    offered = [CODE[name] for name, _ in FRAMEWORK_SCHEDULES[framework]]
    names = ", ".join(name for name, _ in FRAMEWORK_SCHEDULES[framework])
    rules = [
        Rule(
            family=FAMILY,
            text=f"{framework} ships the schedules {names}",
            axes=("schedule",),
            check=lambda g: np.isin(g["schedule"], offered),
            source="; ".join(f"{n}: {s}" for n, s in FRAMEWORK_SCHEDULES[framework]),
        ),
        *_shape_rules(),
    ]
    if framework == "torchtitan":
        rules += _torchtitan_rules() + _dominated_rules(problem)
    if framework == "megatron":
        rules += _combined_rules(problem)
    return rules
