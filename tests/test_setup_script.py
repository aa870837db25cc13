"""The README's test set-up is one command (issue 24, "two commands, as promised"):
``scripts/test`` installs a headless Chromium when none is on PATH, then the environment and
the tests; ``.ci/run`` runs the README's command verbatim."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "test"


def _readme_commands() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Run the tests") : readme.index("## Tour")]
    return re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)


def test_the_readme_test_set_up_is_one_command_that_ci_runs_verbatim() -> None:
    assert _readme_commands() == ["scripts/test"]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    block = ci[ci.index("# --- the README's test command") :].split("\n# ---\n")[0]
    assert block.splitlines()[1:] == ["scripts/test"]
    assert os.access(SCRIPT, os.X_OK) and os.access(REPO / ".ci" / "run", os.X_OK)


def test_the_script_creates_the_environment_installs_and_runs_pytest() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    tail = text[text.index("# --- the environment and the tests ---") :].splitlines()[1:]
    assert tail == [
        "python3 -m venv .venv",
        ". .venv/bin/activate",
        'pip install -e ".[dev,bench]"',
        'python -m pytest -q "$@"',
    ]


def _browser_step() -> str:
    """The part of ``scripts/test`` that installs the browser (between its marker comments)."""
    text = SCRIPT.read_text(encoding="utf-8")
    start = text.index("# --- the browser")
    return text[start : text.index("# --- the environment and the tests ---")]


@pytest.mark.parametrize(
    ("uid", "browser", "apt", "expected", "code"),
    [
        (
            "0",
            None,
            True,
            ["apt-get update -q", "apt-get install -y -q chromium-headless-shell"],
            0,
        ),
        (
            "1000",
            None,
            True,
            ["sudo", "apt-get update -q", "sudo", "apt-get install -y -q chromium-headless-shell"],
            0,
        ),
        ("1000", "chromium", True, [], 0),
        ("0", "google-chrome", True, [], 0),
        ("0", None, False, [], 1),
    ],
)
def test_the_browser_is_installed_only_when_missing(tmp_path, uid, browser, apt, expected, code):
    """The install step on a PATH of stubs: apt-get (through sudo unless root) when no browser
    is found, nothing otherwise; no apt-get is one clear line and exit 1."""
    log = tmp_path / "calls"
    stubs = {"id": f"echo {uid}", "sudo": f'echo sudo >> {log}; "$@"'}
    if apt:
        stubs["apt-get"] = f'echo "apt-get $*" >> {log}'
    if browser:
        stubs[browser] = "exit 0"
    for name, body in stubs.items():
        (tmp_path / name).write_text(f"#!/bin/bash\n{body}\n")
        (tmp_path / name).chmod(0o755)
    script = "set -euo pipefail\n" + _browser_step()
    env = {"PATH": str(tmp_path)}
    done = subprocess.run(["/bin/bash", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == code, done.stderr
    assert (log.read_text().splitlines() if log.exists() else []) == expected
    if code:
        assert done.stderr.count("\n") == 1 and "no headless Chromium" in done.stderr
