"""``autopar schema NAME``: print the JSON schema of ``--format json`` output."""

from __future__ import annotations

from typing import Annotated

import typer

from autopar.cli import options as o
from autopar.cli.errors import guarded
from autopar.cli.help import EXAMPLES, GroupedCommand
from autopar.cli.output import emit, to_json
from autopar.outputs.schema import schema


def register(app: typer.Typer) -> None:
    @app.command("schema", cls=GroupedCommand, epilog=EXAMPLES["schema"])
    @guarded
    def schema_command(
        name: Annotated[str, typer.Argument(help="evaluate or solve.")],
        output: o.Output = None,
    ) -> None:
        """Print the JSON schema of `evaluate` or `solve` --format json output."""
        emit(to_json(schema(name)), output)
