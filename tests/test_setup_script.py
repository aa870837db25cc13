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
    commands = [line for line in tail if line.strip() and not line.lstrip().startswith("#")]
    assert commands == [
        "if [ -x .venv/bin/python ] && ! is_312 .venv/bin/python; then",
        '    "$python" -m venv --clear .venv  # an older .venv (3.11) is rebuilt for 3.12',
        "else",
        '    "$python" -m venv .venv',
        "fi",
        ". .venv/bin/activate",
        'pip install -e ".[dev,bench]"',
        "pip install --no-deps -r tests/requirements-nodeps.txt",
        'python -m pytest -q "$@"',
    ]


def _step(marker: str) -> str:
    """The part of ``scripts/test`` from its ``# --- marker`` comment to the next one."""
    text = SCRIPT.read_text(encoding="utf-8")
    start = text.index(f"# --- {marker}")
    return text[start : text.index("\n# --- ", start) + 1]


def _browser_step() -> str:
    return _step("the browser")


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


def _stub(path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


@pytest.mark.parametrize(
    ("on_path", "pyenv", "expected"),
    [
        ({"python3.12": 0, "python3": 1}, None, "python3.12"),
        ({"python3": 0}, None, "python3"),  # python3 is 3.12 (Ubuntu 24.04)
        ({"python3.12": 1, "python3": 1}, ["3.11.7", "3.12.10", "3.12.1", "3.13.0"], "3.12.10"),
        ({"python3": 1}, ["3.11.7"], None),
        ({}, None, None),
    ],
)
def test_the_script_finds_python_3_12_or_says_it_needs_it(tmp_path, on_path, pyenv, expected):
    """The test environment is Python 3.12 (the consumers' current releases publish for it
    only): python3.12, a python3 that is 3.12, or the newest 3.12 pyenv has (its python3.12 shim
    fails unless 3.12 is selected); none is one clear line and exit 1. A stub exiting 0 is 3.12."""
    bin_dir, root = tmp_path / "bin", tmp_path / "pyenv"
    for name, version_check in on_path.items():
        _stub(bin_dir / name, f"exit {version_check}")
    if pyenv is not None:
        listing = "\\n".join(pyenv)
        _stub(bin_dir / "pyenv", f'[ "$1" = root ] && echo {root} || printf "{listing}\\n"')
        for version in pyenv:
            _stub(root / "versions" / version / "bin" / "python3.12", "exit 0")
    for tool in ("grep", "sort", "tail"):
        (bin_dir / tool).parent.mkdir(parents=True, exist_ok=True)
        (bin_dir / tool).symlink_to(f"/usr/bin/{tool}")
    script = "set -euo pipefail\n" + _step("Python 3.12") + 'echo "$python"\n'
    done = subprocess.run(
        ["/bin/bash", "-c", script], env={"PATH": str(bin_dir)}, capture_output=True, text=True
    )
    if expected is None:
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and "need Python 3.12" in done.stderr
    elif expected.startswith("python"):
        assert (done.returncode, done.stdout.strip()) == (0, str(bin_dir / expected))
    else:
        python = root / "versions" / expected / "bin" / "python3.12"
        assert (done.returncode, done.stdout.strip()) == (0, str(python)), done.stderr
