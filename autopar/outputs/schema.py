"""The JSON contract of ``--format json``: the schema files in ``autopar/schemas/``, with the
layout object filled in from the axes table (``autopar.base.axes.AXES``), so that a new axis is in
the contract without editing the files."""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

from autopar.base.axes import AXES
from autopar.base.errors import InputError, excerpt

SCHEMA_NAMES: tuple[str, ...] = ("evaluate", "solve")


@cache
def _template(name: str) -> dict[str, Any]:
    text = resources.files("autopar").joinpath("schemas", f"{name}.schema.json").read_text()
    return json.loads(text)


def layout_schema() -> dict[str, Any]:
    """``properties`` and ``required`` of the layout object, one entry per axis."""
    return {
        "properties": {axis.layout_attr: axis.json_schema() for axis in AXES},
        "required": [axis.layout_attr for axis in AXES],
    }


def schema(name: str) -> dict[str, Any]:
    """The whole JSON schema of ``name`` (``evaluate`` or ``solve``)."""
    if name not in SCHEMA_NAMES:
        raise InputError(
            f"must be one of {', '.join(SCHEMA_NAMES)}, got {excerpt(name)}", source="NAME"
        )
    out = copy.deepcopy(_template(name))
    if name == "evaluate":
        out["properties"]["layout"].update(layout_schema())
    return out
