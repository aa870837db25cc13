"""Typed errors. User-input problems are ``InputError`` (a ``ValueError``); an unsatisfiable
problem is ``InfeasibleError``. The CLI turns the first into one line and exit code 2, the second
into an explanation and exit code 1. ``assert`` is kept for internal invariants only."""

from __future__ import annotations

from typing import Any


class InputError(ValueError):
    """Bad user input: names where (``source``: a file path or ``--flag``), what (``field``) and the
    rule that was broken. ``str(err)`` is the one line the CLI prints."""

    def __init__(self, rule: str, *, source: str | None = None, field: str | None = None) -> None:
        self.rule = rule
        self.source = source
        self.field = field
        super().__init__(self._line())

    def _line(self) -> str:
        where = ": ".join(part for part in (self.source, self.field) if part)
        return f"{where}: {self.rule}" if where else self.rule

    def with_source(self, source: str) -> InputError:
        """The same error, attributed to ``source`` when it names none yet."""
        if self.source:
            return self
        return InputError(self.rule, source=source, field=self.field)


class InfeasibleError(Exception):
    """No layout satisfies the rules and the memory capacity. ``explanation`` is a JSON-ready dict
    (binding rule families, nearest miss, suggested changes); ``str(err)`` is its summary."""

    def __init__(self, summary: str, *, explanation: dict[str, Any]) -> None:
        self.explanation = explanation
        super().__init__(summary)
