"""Turn autopar's errors into one line on stderr and an exit code, never a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer

from autopar.errors import InfeasibleError, InputError

EXIT_INFEASIBLE = 1
EXIT_BAD_INPUT = 2


def guarded(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command: InputError -> exit 2, InfeasibleError -> exit 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except InputError as err:
            typer.echo(f"autopar: error: {err}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except InfeasibleError as err:
            typer.echo(f"autopar: infeasible: {err}", err=True)
            raise typer.Exit(EXIT_INFEASIBLE) from None

    return wrapper


def run_guarded(app: typer.Typer) -> None:
    """Run the app; an error escaping a command still ends as one line, not a traceback."""
    try:
        app()
    except InputError as err:
        typer.echo(f"autopar: error: {err}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        typer.echo("autopar: interrupted", err=True)
        sys.exit(130)
