"""The ``autopar`` command line (typer). Parses options, calls the Python API, renders.

Exit codes (DESIGN §7): 0 ok, 1 infeasible, 2 bad input (one line naming file, field and rule).

The command modules are imported when a command needs them: ``autopar solve ...`` builds an app
with the solve command alone (same options, help and output), so it loads neither the
calibration nor the sweep code; anything else (``--help``, ``--version``, a mistyped command,
shell completion) and ``from autopar.cli import app`` get the whole app.
"""

from __future__ import annotations

import autopar.base.startup  # noqa: F401  (first: quiet Ctrl-C / SIGTERM while the CLI starts)

# isort: split
import importlib
import os
import sys
from typing import Any

import typer

from autopar.cli.errors import run_guarded

COMMAND_MODULES: dict[str, str] = {
    "solve": "solve_cmd",
    "evaluate": "estimate_cmd",
    "models": "presets_cmd",
    "gpus": "presets_cmd",
    "stacks": "presets_cmd",
    "sweep": "sweep_cmd",
    "schema": "schema_cmd",
    "calibrate": "calibrate",
    "bench": "calibrate",
}
"""Each top-level command and the module of ``autopar.cli`` whose ``register`` adds it, in the
order of ``autopar --help`` (``tests/test_architecture.py`` checks it against the whole app)."""


def _version(value: bool) -> None:
    if value:
        from autopar import __version__

        typer.echo(f"autopar {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """autopar: solve | evaluate | sweep | calibrate | bench | models | gpus | stacks | schema."""


def build_app(command: str | None = None) -> typer.Typer:
    """The command line with every command, or with ``command`` alone (a name of
    ``COMMAND_MODULES``: the module that registers it is the only one imported)."""
    app = typer.Typer(
        name="autopar",
        help="The provably fastest parallel layout for training a transformer on a GPU cluster.",
        no_args_is_help=True,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
        add_completion=True,
    )
    app.callback()(_root)
    wanted = [COMMAND_MODULES[command]] if command in COMMAND_MODULES else COMMAND_MODULES.values()
    for module in dict.fromkeys(wanted):
        importlib.import_module(f"autopar.cli.{module}").register(app)
    return app


def _command(argv: list[str]) -> str | None:
    """The command ``argv`` runs, when it is the first word and no shell completion is asked
    for (typer reads ``_<PROG>_COMPLETE``); else None: the whole app."""
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None
    return argv[0] if argv and argv[0] in COMMAND_MODULES else None


def __getattr__(name: str) -> Any:
    """``app``, the whole command line, built on first use (PEP 562)."""
    if name == "app":
        globals()["app"] = app = build_app()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    run_guarded(build_app(_command(sys.argv[1:])))
