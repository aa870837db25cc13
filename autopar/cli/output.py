"""Writing command output: to stdout, or to ``--output`` (``autopar.base.files``: a file
atomically, a stream in place), and an incomplete result beside the output, never over it."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from typing import Any

from autopar.base.files import output_target, partial_target, write_atomic, write_stream


def _line(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def emit(text: str, output: str | None) -> None:
    """The command's result: to ``output``, else stdout (every byte, or ``BrokenPipeError``)."""
    if output:
        write_atomic(output, _line(text))
    else:
        write_stream(sys.stdout, _line(text))


def emit_partial(text: str, output: str | None) -> str:
    """An incomplete result (an interrupted sweep): a file output gets it as
    ``NAME.partial.EXT`` beside it, so a previous complete result is never replaced; stdout or a
    stream gets it in place. Returns where it went, for the message."""
    if not output:
        write_stream(sys.stdout, _line(text))
        return "stdout"
    target = partial_target(output_target(output))
    write_atomic(target, _line(text))
    return target.shown


@contextlib.contextmanager
def signals_held(output: str | None) -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while a partial result goes to a file (milliseconds: the write
    of what an interrupt saved is not lost to a second interrupt), then take effect. A stream
    (a pipe whose reader may never read) is written with the signals live."""
    if not output or not output_target(output).is_file:
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):  # no signal masks here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False)
