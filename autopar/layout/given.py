"""The layout and the per-stage plan a user gives (``autopar evaluate``), checked against the
rules: ``InputError`` names the first rule broken, as the user typed it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autopar.base.axes import AXIS, GIVEN_AXES, PRODUCTS, RECOMPUTE_MODES
from autopar.base.errors import InputError, excerpt
from autopar.inputs import limits as bounds
from autopar.inputs.problem import AXIS_MAXIMA
from autopar.inputs.specs import Problem
from autopar.layout.plan import Layout
from autopar.layout.rules import sequence_parallel_on
from autopar.layout.schedule_rules import SEARCH_FAMILY
from autopar.layout.space import build_space, derive
from autopar.layout.stages import (
    PIPELINE_PLANS,
    StagePlan,
    StageRecompute,
    check_plan,
    even_plan,
    parse_plan,
    placement_of,
)


def check_pipeline_plan(value: str) -> None:
    if value not in PIPELINE_PLANS:
        raise InputError(
            f"must be one of {', '.join(PIPELINE_PLANS)}, got {value!r}", source="--pipeline-plan"
        )


def layout_of(problem: Problem, *, pipeline_plan: str = "uniform", **values: Any) -> Layout:
    """The layout ``evaluate`` scores: the given axis values (``Layout`` attribute names; the
    others at their ``evaluate`` defaults), with ``dp`` and ``grad_accum`` from the products and
    sequence parallelism on with TP unless the problem's options say otherwise. Raises
    ``InputError`` naming the first rule the layout breaks (with a per-stage plan, the plan
    sets the split: the even-split rules do not apply)."""
    check_pipeline_plan(pipeline_plan)
    given = {axis.layout_attr: axis for axis in GIVEN_AXES}
    unknown = set(values) - set(given)
    if unknown:
        raise TypeError(f"unknown layout value(s): {', '.join(sorted(unknown))}")
    chosen = {attr: values.get(attr, axis.default_for_evaluate) for attr, axis in given.items()}
    for attr, axis in given.items():
        value = chosen[attr]
        flag = f"--{attr.replace('_', '-')}"
        if axis.kind == "flag" and not isinstance(value, bool):
            raise InputError(f"must be true or false, got {excerpt(value)}", source=flag)
        if axis.kind == "size":
            maximum = AXIS_MAXIMA.get(axis.name, bounds.MAX_GPUS)
            chosen[attr] = bounds.check_int(value, source=flag, maximum=maximum)
        if axis.kind == "mode" and (isinstance(value, bool) or value not in axis.choices):
            choices = ", ".join(map(str, axis.choices))
            raise InputError(f"must be one of {choices}, got {excerpt(value)}", source=flag)
    space = build_space(problem)
    names = {axis.layout_attr: axis.name for axis in GIVEN_AXES}
    derived = derive(problem, {names[attr]: v for attr, v in chosen.items() if attr in names})
    layout = Layout(
        **chosen,
        **{AXIS[a].layout_attr: derived[a] for a in PRODUCTS},
        sequence_parallel=bool(sequence_parallel_on(problem, chosen["tp"])),
    )
    per_stage = ("layers vs PP",) if pipeline_plan == "per-stage" else ()
    skip = ("pins and limits", SEARCH_FAMILY, *per_stage)
    broken = space.broken_rule(layout.grid_row(), skip=skip)
    if broken is not None:
        family, _, rule = broken.partition(": ")
        raise InputError(rule, source="layout", field=family)
    return layout


def plan_of(
    problem: Problem,
    layout: Layout,
    *,
    stage_layers: str | Sequence[int] | None = None,
    stage_recompute: str | None = None,
) -> StagePlan:
    """A per-stage plan for ``layout``: ``stage_layers`` per chunk (``pp*vpp`` entries, virtual
    stage order) and ``stage_recompute`` per stage (``none``, ``selective``, ``full:K``; one entry
    for all), or, without layers, the even split with the layout's recompute. Raises
    ``InputError`` naming the rule a plan breaks."""
    if stage_layers is None:
        even = even_plan(problem.model.num_layers, layout.pp, layout.vpp, StageRecompute())
        # the split is in model order whatever the placement (autopar.layout.stages)
        stage_layers = even.chunk_layers
    if stage_recompute is None:
        whole = max(problem.model.num_layers, 1)
        stage_recompute = f"full:{whole}" if layout.recompute == "full" else layout.recompute
    plan = parse_plan(
        pp=layout.pp,
        vpp=layout.vpp,
        stage_layers=stage_layers,
        stage_recompute=stage_recompute,
        placement=placement_of(layout.pipeline_schedule),
    )
    check_plan(plan, num_layers=problem.model.num_layers, recompute_modes=RECOMPUTE_MODES)
    return plan
