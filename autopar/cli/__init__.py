"""The ``autopar`` command line (typer). Parses options, calls the Python API, renders.

Exit codes (DESIGN §7): 0 ok, 1 infeasible, 2 bad input (one line naming file, field and rule).
"""

from __future__ import annotations

import autopar.base.startup  # noqa: F401  (first: quiet Ctrl-C / SIGTERM while the CLI starts)

# isort: split
import typer

from autopar.cli import calibrate, estimate_cmd, presets_cmd, schema_cmd, solve_cmd, sweep_cmd
from autopar.cli.errors import run_guarded

app = typer.Typer(
    name="autopar",
    help="The provably fastest parallel layout for training a transformer on a GPU cluster.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=True,
)


def _version(value: bool) -> None:
    if value:
        from autopar import __version__

        typer.echo(f"autopar {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """autopar: solve | evaluate | sweep | calibrate | bench | models | gpus | stacks | schema."""


solve_cmd.register(app)
estimate_cmd.register(app)
presets_cmd.register(app)
sweep_cmd.register(app)
schema_cmd.register(app)


calibrate.register(app)


def main() -> None:
    run_guarded(app)
