"""Turn autopar's errors into one line on stderr and an exit code, never a traceback.

Exit codes (DESIGN §7): 0 ok, 1 infeasible, 2 bad input or an output that cannot be written
(a closed stdout included, and an output that is also an input), 130 interrupted (SIGINT), 143
terminated (SIGTERM), 141 quietly when the reader of stdout goes away, 3 an internal error (a
bug: please report), 4 the machine failed the run (a library could not load, out of memory;
sweep points lost with their worker process: the finished ones are written, marked partial).
Option-parser usage errors keep typer/click's own format and exit code 2.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import typer
from typer.models import ArgumentInfo

from autopar.base.errors import InfeasibleError, InputError, OutputError, shorten
from autopar.base.files import output_target, same_file
from autopar.base.startup import EXIT_ENVIRONMENT as EXIT_ENVIRONMENT
from autopar.base.startup import cannot_start_line

# The parser's usage errors (``click.ClickException``: vendored as ``typer._click`` by recent
# typer releases, the click package before); taken from typer's own ``BadParameter`` so that
# no click import is needed.
_CLICK_EXITS = tuple(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
"""The parser's own exits and usage errors: they keep click's format and exit code."""

EXIT_INFEASIBLE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_BROKEN_PIPE = 141
"""The reader of stdout went away (``autopar stacks | head``): quiet, as a SIGPIPE would end a
C tool (128 + 13)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that ``finally`` blocks (temp files) run; a
    ``KeyboardInterrupt`` so that what stops a run on Ctrl-C (keeping finished sweep points)
    stops it on SIGTERM too."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"autopar: {message}", err=True)
    return typer.Exit(code)


def _outputs(kwargs: dict[str, Any]) -> list[str]:
    """The ``--output`` files of a command: one, or one per format when ``--format`` asks for
    several (``autopar.cli.render.format_targets``)."""
    output = kwargs.get("output")
    if output is None:
        return []
    several = "," in str(kwargs.get("format") or "")
    if not several:
        return [output]
    return [p.strip() for p in os.fspath(output).split(",") if p.strip()]


def _arguments(command: Callable[..., Any]) -> set[str]:
    """The command's positional arguments (named ``LOGS`` in messages, not ``--logs``)."""
    signature = inspect.signature(command, eval_str=True)
    return {
        name
        for name, parameter in signature.parameters.items()
        if any(isinstance(meta, ArgumentInfo) for meta in get_args(parameter.annotation))
    }


def _input_paths(kwargs: dict[str, Any]) -> Any:
    """(keyword, path) for every value of the command that may name an input file: strings and
    paths, the items of lists and mappings, and the items of comma-separated lists."""
    for key, value in kwargs.items():
        if key == "output":
            continue
        items = list(value.values()) if isinstance(value, dict) else value
        for item in items if isinstance(items, list | tuple) else [items]:
            if isinstance(item, Path):
                yield key, item
            elif isinstance(item, str):
                yield from ((key, part) for part in {item, *item.split(",")} if part)


def check_output(kwargs: dict[str, Any], arguments: set[str] = frozenset()) -> None:
    """Before any work: stdout is open when it is the output; ``--output`` can be written and
    is none of the command's input files (``calibrate -o logs/a.log logs/*.log`` and ``solve
    --model cfg.json -o cfg.json`` used to destroy the input, exit 0)."""
    outputs = _outputs(kwargs)
    if not outputs:
        if sys.stdout is None:
            raise OutputError("stdout is closed; nothing can be written there (use --output FILE)")
        return
    for output in outputs:
        target = output_target(output)
        if not target.is_file:
            continue
        for key, path in _input_paths(kwargs):
            if same_file(path, target.path):
                name = key.upper() if key in arguments else f"--{key.replace('_', '-')}"
                raise OutputError(
                    f"is also an input ({name}); write the result to another file",
                    source=f"--output {output}",
                )


def _while_importing(err: BaseException) -> bool:
    """Whether ``err`` was raised while a module was being imported (importlib's frames)."""
    trace = err.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        trace = trace.tb_next
    return False


def guarded(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command: stdout and ``--output`` checked before any work (``check_output``);
    InputError and OutputError -> exit 2, InfeasibleError -> exit 1, Ctrl-C -> 130, SIGTERM ->
    143, anything else -> one line and exit 3."""
    arguments = _arguments(command)

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings():
                # numpy's RuntimeWarnings (overflow in a broken profile's figures) would add
                # lines to the one-line contract; the figures are checked where they are used
                warnings.simplefilter("ignore", RuntimeWarning)
                check_output(kwargs, arguments)
                return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, *_CLICK_EXITS):
            raise
        except (InputError, OutputError) as err:
            raise _fail(f"error: {err}", EXIT_BAD_INPUT) from None
        except InfeasibleError as err:
            raise _fail(f"infeasible: {err}", EXIT_INFEASIBLE) from None
        except Terminated:
            raise _fail("terminated", EXIT_TERMINATED) from None
        except KeyboardInterrupt:
            raise _fail("interrupted", EXIT_INTERRUPTED) from None
        except (ImportError, MemoryError) as err:
            if isinstance(err, ImportError) or _while_importing(err):
                # a command loads its libraries (OR-Tools, pandas) itself: under a memory
                # limit they fail to load, which is the machine's doing, not the input's
                raise _fail(cannot_start_line(err), EXIT_ENVIRONMENT) from None
            raise _fail(
                "error: out of memory (input too large, or a memory limit too low?)", EXIT_BAD_INPUT
            ) from None
        except BrokenPipeError:
            # Python flushes stdout again at exit; point it at /dev/null so that flush is quiet.
            with contextlib.suppress(AttributeError, OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(EXIT_BROKEN_PIPE) from None
        except OSError as err:
            name = f": {shorten(err.filename, 120)}" if err.filename else ""
            reason = err.strerror or type(err).__name__
            raise _fail(f"error: {reason}{name}", EXIT_BAD_INPUT) from None
        except Exception as err:  # a bug: still one line, never a traceback
            text = shorten(err, 200)
            raise _fail(
                f"internal error (please report): {type(err).__name__}: {text}", EXIT_INTERNAL
            ) from None

    return wrapper


def run_guarded(app: typer.Typer) -> None:
    """Run the app with SIGTERM turned into an exception (so temp files are removed); an error
    escaping a command still ends as one line, not a traceback."""
    with contextlib.suppress(ValueError):  # not the main thread (embedded use): keep default
        signal.signal(signal.SIGTERM, _on_sigterm)
        # Ctrl-C is a KeyboardInterrupt again (autopar.base.startup made it a quiet exit while the
        # imports ran): commands stop cleanly, keeping what is done.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        app()
    except (InputError, OutputError) as err:
        typer.echo(f"autopar: error: {err}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except Terminated:
        typer.echo("autopar: terminated", err=True)
        sys.exit(EXIT_TERMINATED)
    except KeyboardInterrupt:
        typer.echo("autopar: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
