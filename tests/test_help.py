"""Help that teaches (issue 24): every option of the problem-building commands sits in a named
group, help prints the groups in order and ends with examples that parse; ``autopar models``
shows aliases and parameter counts."""

from __future__ import annotations

import re
import shlex

import pytest
import typer
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cli.help import EXAMPLES, OTHER, PANELS, panel_of
from autopar.inputs.echo import parameter_count
from autopar.inputs.loading import load_model

ROOT = typer.main.get_command(app)
GROUPED = ("solve", "evaluate", "sweep")


def _command(path: str):
    command = ROOT
    for name in path.split():
        command = command.commands[name]
    return command


@pytest.mark.parametrize("name", GROUPED)
def test_every_option_has_a_group(name):
    command = _command(name)
    loose = [p.name for p in command.params if p.param_type_name == "option" and p.name != "help"]
    assert [n for n in loose if panel_of(_param(command, n)) == OTHER] == []


def _param(command, name):
    return next(p for p in command.params if p.name == name)


@pytest.mark.parametrize("name", GROUPED)
def test_help_lists_the_groups_in_order_then_examples(name):
    text = CliRunner().invoke(app, [name, "--help"], terminal_width=100).output
    headers = re.findall(r"^(\w[\w ]*):$", text, flags=re.M)
    groups = [h for h in headers if h in PANELS]
    assert groups == [p for p in PANELS if p in groups]  # the documented order
    assert {"Model", "Cluster", "Training", "Search", "Output"} <= set(groups)
    assert headers[-1] == "Examples" and OTHER in headers
    examples = text[text.rindex("Examples:") :]
    assert examples.count(f"autopar {name} ") >= 2
    # the flags an option table groups are where the table says
    command = _command(name)
    section = text[text.index("\nCluster:") : text.index("\nTraining:")]
    assert "--gpus" in section and panel_of(_param(command, "gpus")) == "Cluster"


def _example_lines(block: str) -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", block.strip())
    lines = []
    for line in joined.splitlines():
        words = shlex.split(line.split(">")[0])
        assert words[0] == "autopar"
        lines.append(words[1:])
    return lines


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_parses(name):
    assert _command(name).epilog == EXAMPLES[name]
    for words in _example_lines(EXAMPLES[name]):
        command, rest = ROOT, list(words)
        while isinstance(command, typer.core.TyperGroup):
            command = command.commands[rest.pop(0)]
        command.make_context(command.name, rest)  # raises a usage error on a bad option


def test_models_shows_aliases_and_parameters():
    text = CliRunner().invoke(app, ["models"]).output
    row = next(line for line in text.splitlines() if line.startswith("llama-3-70b "))
    assert "llama-70b" in row.split()[-3:] or "llama-70b," in row
    count = parameter_count(load_model("llama-3-70b"))
    assert f"{count / 1e9:.1f}B" in row.split()
    head = text.splitlines()[0].split()
    assert head[:2] == ["model", "params"] and head[-1] == "aliases"
    # every row that lists aliases names names that load the same model
    for line in text.splitlines()[1:]:
        name, *_, aliases = re.split(r"\s{2,}", line.strip())
        for alias in aliases.split(", ") if aliases != "-" else []:
            assert load_model(alias) == load_model(name)
