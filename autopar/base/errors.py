"""Typed errors, one per kind (DESIGN §7):

- ``InputError`` (a ``ValueError``): bad user input -- a file, a flag or an API argument.
- ``InfeasibleError``: a well-formed problem that no layout satisfies; carries an explanation.
- ``OutputError`` (an ``OSError``): a result cannot be written where the user asked.

Each names where (``source``: a file path or ``--flag``), what (``field``: the key as the user
wrote it) and the rule that was broken. The CLI turns the first and the last into one line and
exit code 2, the second into an explanation and exit code 1. ``assert`` is kept for internal
invariants only. Messages quote values through ``excerpt``, never whole: a value read from a file
can be arbitrarily large (issue 15: a 72 MB one-line error from a YAML alias bomb).
"""

from __future__ import annotations

import math
from typing import Any

EXCERPT_CHARS = 40
"""At most this many characters of a user's value appear in an error message."""


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """A short, bounded description of ``value`` for an error message: the ``repr`` of a scalar
    cut to ``limit`` characters, the size of a container (never its contents, which may be a
    shared-alias structure of astronomic printed size)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 64:  # str() of a huge int is slow (and limited to 4300 digits)
            return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
        text = repr(value)
    elif isinstance(value, float):
        text = repr(value)
    elif isinstance(value, str | bytes):
        text = repr(value[: limit + 1])
    elif isinstance(value, dict):
        return f"a mapping of {len(value)} key(s)"
    elif isinstance(value, list):
        return f"a list of {len(value)} item(s)"
    elif isinstance(value, tuple | set | frozenset | range):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    else:
        return f"a value of type {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shorten(text: object, limit: int = 120) -> str:
    """``text`` on one line, cut to ``limit`` characters (for an exception's message quoted in
    ours; ``excerpt`` is for values)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


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
        return _one_line(f"{where}: {self.rule}" if where else self.rule)

    def with_source(self, source: str) -> InputError:
        """The same error, attributed to ``source`` when it names none yet."""
        if self.source:
            return self
        return InputError(self.rule, source=source, field=self.field)

    def with_field(self, field: str | None) -> InputError:
        """The same error under another field name (the key as the user wrote it)."""
        return InputError(self.rule, source=self.source, field=field)


class InfeasibleError(Exception):
    """No layout satisfies the rules and the memory capacity. ``explanation`` is a JSON-ready dict
    (binding rule families, nearest miss, suggested changes); ``str(err)`` is its summary."""

    def __init__(self, summary: str, *, explanation: dict[str, Any]) -> None:
        self.explanation = explanation
        super().__init__(_one_line(summary))


class OutputError(OSError):
    """A result cannot be written: ``source`` is the flag or path, ``rule`` what went wrong. An
    ``OSError`` so callers catching I/O failures catch it; never a traceback in the CLI."""

    def __init__(self, rule: str, *, source: str | None = None, field: str | None = None) -> None:
        self.rule = rule
        self.source = source
        self.field = field
        where = ": ".join(part for part in (source, field) if part)
        super().__init__(_one_line(f"{where}: {rule}" if where else rule))

    def __str__(self) -> str:
        return str(self.args[0])


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM in the CLI) during a run that has partial results: ``partial`` holds
    what was done (e.g. a ``SweepResult`` of the finished points), ``done`` of ``total``."""

    def __init__(
        self, partial: Any, *, done: int, total: int, cause: BaseException | None = None
    ) -> None:
        self.partial, self.done, self.total = partial, done, total
        self.cause = cause or KeyboardInterrupt()
        """The interrupt itself (``KeyboardInterrupt``, or the CLI's SIGTERM exception)."""
        super().__init__(f"interrupted after {done} of {total}")


MAX_MESSAGE_CHARS = 400


def one_line(text: str) -> str:
    """``text`` flattened to one line of at most ``MAX_MESSAGE_CHARS`` characters."""
    return _one_line(text)


def _one_line(text: str) -> str:
    """Messages are one line of bounded length, whatever a file put in a key or a path."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= MAX_MESSAGE_CHARS else flat[: MAX_MESSAGE_CHARS - 3] + "..."
