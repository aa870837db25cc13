"""Writing command output: to stdout, or atomically to a file (temp file + rename)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import typer

from autopar.errors import InputError


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one."""
    path = Path(path)
    if not path.parent.is_dir():
        raise InputError("directory does not exist", source=str(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def emit(text: str, output: str | None) -> None:
    if output:
        write_atomic(output, text if text.endswith("\n") else text + "\n")
    else:
        typer.echo(text)


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False)
