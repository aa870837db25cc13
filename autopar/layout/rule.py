"""One layout rule: a vectorised predicate over a few grid axes, with its family, source and
kind (``autopar.layout.rules`` holds the table of them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

Grid = Mapping[str, np.ndarray]
RuleKind = Literal["framework", "default", "user"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    family: str
    """Rule family reported when explaining infeasibility."""
    text: str
    """The rule as a user reads it."""
    axes: tuple[str, ...]
    check: Callable[[Grid], np.ndarray]
    """Returns a boolean array: True where the rule holds."""
    source: str
    kind: RuleKind = "framework"
    """``framework``: the framework raises on a layout that breaks it (``source`` cites where);
    ``default``: an autopar default (advice, or what the cost model assumes), which ``lift``
    names the flag to lift when there is one; ``user``: the user's pin, limit or option."""
    lift: str | None = None
    """The autopar flag that lifts the rule, as the user types it (``--no-tp-within-node``)."""
    brief: str = ""
    """The restriction in a few words, for what a proof covers (``text`` when empty)."""
