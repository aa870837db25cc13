"""Writing command output: to stdout, or atomically to a file (temp file + rename)."""

from __future__ import annotations

import json
from typing import Any

import typer

from autopar.base.files import write_atomic


def emit(text: str, output: str | None) -> None:
    if output:
        write_atomic(output, text if text.endswith("\n") else text + "\n")
    else:
        typer.echo(text)


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False)
