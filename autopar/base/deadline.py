"""``--time-limit`` covers the whole command (issue 15): long computations take a ``deadline``
(``time.perf_counter()`` seconds) and call ``check_deadline`` between steps of bounded cost;
past it they stop with ``TimeLimitReached``, which the solver turns into status ``unknown``
with the part cut short reported."""

from __future__ import annotations

import time


class TimeLimitReached(Exception):
    """The deadline passed while a model or a plan was being built."""


def check_deadline(deadline: float | None) -> None:
    """Raise ``TimeLimitReached`` once ``time.perf_counter()`` is past ``deadline``."""
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeLimitReached()
