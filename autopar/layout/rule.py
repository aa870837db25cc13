"""One layout rule: a vectorised predicate over a few grid axes, with its family and source
(``autopar.layout.rules`` holds the table of them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

Grid = Mapping[str, np.ndarray]


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
