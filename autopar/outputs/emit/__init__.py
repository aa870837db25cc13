"""Emitters: a layout as the launch configuration of a training framework (DESIGN §7).

Pure functions, no printing. Each takes an ``Estimate`` (or a bare ``Layout``) and the
``Problem`` it was solved for (the model, the sequence length, the global batch and the precision
are not part of a layout). A format that cannot express part of a layout raises ``InputError``
naming what and which format can; nothing is dropped silently. Each output names the version of
its consumer it targets (``FORMATS``).

One module per consumer: ``megatron`` (Megatron-LM arguments), ``bridge`` (Megatron-Bridge
recipe overrides), ``torchtitan`` (0.3 command line, 0.2 TOML), ``deepspeed`` (JSON config).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from autopar.inputs.specs import Problem
from autopar.layout.plan import Estimate, Layout
from autopar.outputs.emit.bridge import BRIDGE_TARGET, bridge_overrides, bridge_text
from autopar.outputs.emit.common import layout_of, refuse_stage_plan
from autopar.outputs.emit.deepspeed import DEEPSPEED_TARGET, deepspeed_json, deepspeed_notes
from autopar.outputs.emit.megatron import (
    MEGATRON_TARGET,
    megatron_args,
    megatron_flags,
    megatron_text,
)
from autopar.outputs.emit.torchtitan import (
    TORCHTITAN_02_TARGET,
    TORCHTITAN_TARGET,
    torchtitan_args,
    torchtitan_config,
    torchtitan_text,
    torchtitan_toml,
)


@dataclass(frozen=True, slots=True)
class Format:
    """One launch format: its text, the consumer version it targets, and the framework whose
    rules and the stack preset whose defaults a problem solved for it gets unless the user names
    others (``--framework``, ``--stack``; ``None``: autopar's default stack)."""

    target: str
    text: Callable[[Estimate | Layout, Problem], str]
    framework: str
    stack: str | None = None
    notes: Callable[[Estimate | Layout, Problem], tuple[str, ...]] = lambda item, problem: ()
    per_stage: bool = False
    """Whether it expresses a per-stage pipeline plan (``Estimate.per_stage``); the others
    refuse one (``refuse_stage_plan``)."""


def _deepspeed_text(item: Estimate | Layout, problem: Problem) -> str:
    return json.dumps(deepspeed_json(item, problem), indent=2)


def _toml_text(item: Estimate | Layout, problem: Problem) -> str:
    return torchtitan_toml(item, problem).rstrip()


FORMATS: dict[str, Format] = {
    "megatron": Format(MEGATRON_TARGET, megatron_text, "megatron", per_stage=True),
    "megatron-bridge": Format(BRIDGE_TARGET, bridge_text, "megatron", "megatron-bridge-0.6"),
    "torchtitan": Format(
        TORCHTITAN_TARGET, torchtitan_text, "torchtitan", "torchtitan-0.3", per_stage=True
    ),
    "torchtitan-0.2": Format(
        TORCHTITAN_02_TARGET, _toml_text, "torchtitan", "torchtitan-0.3", per_stage=True
    ),
    "deepspeed": Format(
        DEEPSPEED_TARGET, _deepspeed_text, "deepspeed", "deepspeed-0.19", deepspeed_notes
    ),
}
EMITTERS: tuple[str, ...] = tuple(FORMATS)

__all__ = [
    "EMITTERS",
    "FORMATS",
    "Format",
    "bridge_overrides",
    "deepspeed_json",
    "deepspeed_notes",
    "layout_of",
    "megatron_args",
    "megatron_flags",
    "refuse_stage_plan",
    "torchtitan_args",
    "torchtitan_config",
    "torchtitan_toml",
]
