"""Outputs that are not plain new files (issue 24, fault findings 3, 6, 10-15): streams written in
place and never renamed over, inputs never overwritten, modes kept, every byte or an error, odd
names. ``autopar schema solve`` is the cheapest command with an ``--output``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest
import typer

from autopar.base.errors import OutputError
from autopar.base.files import STALE_TEMP_S, write_atomic
from autopar.cli import app
from autopar.cli.errors import guarded
from tests.conftest import DATA, REPO

SCHEMA = ["schema", "solve"]


def _schema(runner, *args: str):
    return runner.invoke(app, [*SCHEMA, *args])


def test_a_link_to_stdout_is_written_through_not_replaced(runner, tmp_path) -> None:
    """Finding 3: ``-o /dev/stdout`` as root replaced the system's link with a regular file
    (exit 0, nothing printed). A user's link to ``/proc/self/fd/1`` stands in for it here."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    result = _schema(runner, "-o", str(link))
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    assert json.loads(result.stdout)["title"]


@pytest.mark.parametrize("name", ["-", "/dev/stdout", "/dev/fd/1"])
def test_stdout_names_write_to_stdout(runner, tmp_path, monkeypatch, name) -> None:
    monkeypatch.chdir(tmp_path)
    result = _schema(runner, "-o", name)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["title"]
    assert list(tmp_path.iterdir()) == []  # no file called "-"


def test_devices_are_written_in_place_and_their_errors_reported(runner) -> None:
    assert _schema(runner, "-o", os.devnull).exit_code == 0
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    full = _schema(runner, "-o", "/dev/full")
    assert full.exit_code == 2 and "no space left on device" in full.stderr


def test_a_link_to_a_file_writes_the_file_and_keeps_the_link(tmp_path) -> None:
    (tmp_path / "real.json").write_text("old\n")
    (tmp_path / "link.json").symlink_to("real.json")
    write_atomic(tmp_path / "link.json", "new\n")
    assert (tmp_path / "link.json").is_symlink()
    assert (tmp_path / "real.json").read_text() == "new\n"


def test_an_output_that_is_an_input_is_refused_before_any_work(runner, tmp_path) -> None:
    """Finding 6: both destroyed their input and exited 0."""
    config = tmp_path / "cfg.json"
    config.write_bytes((DATA / "llama-3-70b-config.json").read_bytes())
    before = config.read_bytes()
    result = runner.invoke(
        app, ["solve", "--model", str(config), "--gpus", "64", "-o", str(config)]
    )
    assert result.exit_code == 2
    assert "is also an input (--model)" in result.stderr
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("all_reduce_a.log", "all_gather_b.log"):
        source = (
            "a100_1n8g_all_reduce_abci.log"
            if "reduce" in name
            else "a100_1n8g_all_gather_superbench.log"
        )
        (logs / name).write_bytes((DATA / "nccl" / source).read_bytes())
    victim = logs / "all_reduce_a.log"
    log_bytes = victim.read_bytes()
    args = ["calibrate", "--output", str(victim), *map(str, sorted(logs.iterdir()))]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "is also an input (LOGS)" in result.stderr
    assert config.read_bytes() == before and victim.read_bytes() == log_bytes
    link = tmp_path / "alias.json"
    link.symlink_to(config)  # the same file under another name
    result = runner.invoke(app, ["solve", "--model", str(link), "--gpus", "64", "-o", str(config)])
    assert result.exit_code == 2 and config.read_bytes() == before


def test_an_existing_file_keeps_its_mode(runner, tmp_path) -> None:
    """Finding 10: ``chmod 600 p.json`` became 0644 after a run."""
    out = tmp_path / "p.json"
    out.write_text("old\n")
    out.chmod(0o600)
    assert _schema(runner, "-o", str(out)).exit_code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and json.loads(out.read_text())


def test_a_closed_stdout_is_an_error_before_any_work(monkeypatch) -> None:
    """Finding 11: ``autopar solve ... >&-`` exited 0 with the output lost (Python sets
    ``sys.stdout`` to None and click's echo then writes nothing)."""
    ran = []

    @guarded
    def command(output: str | None = None) -> None:
        ran.append(output)

    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(typer.Exit) as stop:
        command(output=None)
    assert stop.value.exit_code == 2 and ran == []
    command(output=os.devnull)  # an --output does not need stdout
    assert ran == [os.devnull]


def test_a_reader_leaving_in_the_middle_of_a_large_write_is_141() -> None:
    """Finding 11: ``sweep --format html | head -c 100`` exited 0 for any page over 64 KiB (the
    write to the pipe came back short and Python dropped the rest without an error)."""
    code = (
        "import sys, typer\n"
        "from autopar.cli.errors import guarded\n"
        "from autopar.cli.output import emit\n"
        "@guarded\n"
        "def command(output=None):\n"
        "    emit('x' * 5_000_000, None)\n"
        "try:\n"
        "    command()\n"
        "except typer.Exit as stop:\n"
        "    sys.exit(stop.exit_code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert process.stdout.read(100) == b"x" * 100
    process.stdout.close()
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 141, stderr
    assert stderr == b""


def test_a_name_that_is_not_utf8_is_printed_and_stored_readably(runner, tmp_path) -> None:
    """Finding 12: ``calibrate $'all_reduce_\\xff.log'`` exited 3 (UnicodeEncodeError), or wrote
    a profile YAML could not read back (``\\uDCFF``)."""
    log = os.fsdecode(bytes(tmp_path) + b"/all_reduce_\xff.log")
    with open(os.fsencode(log), "wb") as stream:
        stream.write((DATA / "nccl" / "a100_1n8g_all_reduce_abci.log").read_bytes())
    profile = tmp_path / "p.yaml"
    result = runner.invoke(app, ["calibrate", log, "-o", str(profile)])
    assert result.exit_code == 0, result.output
    assert "all_reduce_\\xff.log" in result.stdout and "all_reduce_\\xff.log" in profile.read_text()
    compare = runner.invoke(app, ["calibrate", log, "--profile", str(profile), "--compare"])
    assert compare.exit_code == 0, compare.output
    out = os.fsdecode(bytes(tmp_path) + b"/out\xff.txt")
    write_atomic(out, "name: m\udcff\n")  # text holding a surrogate: escaped, not an error
    with open(os.fsencode(out), "rb") as written:
        assert written.read() == b"name: m\\udcff\n"


@pytest.mark.parametrize("name", ["newdir/", "exist.json/"])
def test_a_trailing_slash_is_refused(runner, tmp_path, name) -> None:
    """Finding 13: ``-o newdir/`` made a file ``newdir``; ``-o exist.json/`` overwrote it."""
    (tmp_path / "exist.json").write_text("{}\n")
    result = _schema(runner, "-o", f"{tmp_path}/{name}")  # (a Path drops the slash)
    assert result.exit_code == 2 and "ends with '/'" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exist.json"]
    assert (tmp_path / "exist.json").read_text() == "{}\n"


@pytest.mark.parametrize("length", [242, 250, 255])
def test_names_up_to_name_max_are_written(runner, tmp_path, length) -> None:
    """Finding 14: 242-255-byte names failed ("file name too long": the temp name added 14)."""
    out = tmp_path / ("a" * (length - 5) + ".json")
    assert _schema(runner, "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text())["title"]
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_only_autopars_own_stale_temps_are_removed(tmp_path) -> None:
    """Finding 15: the cleanup removed a user's ``.plan.json.my-notes.tmp`` once 10 min old."""
    notes = tmp_path / ".plan.json.my-notes.tmp"
    orphan = tmp_path / ".plan.json.abcd_123.autopar.tmp"  # autopar's pattern (files.TEMP_MARKER)
    fresh = tmp_path / ".plan.json.efgh_456.autopar.tmp"
    other = tmp_path / ".other.json.abcd_123.autopar.tmp"
    for path in (notes, orphan, fresh, other):
        path.write_text("x")
    old = time.time() - STALE_TEMP_S - 60
    for path in (notes, orphan, other):
        os.utime(path, (old, old))
    write_atomic(tmp_path / "plan.json", "{}\n")
    assert not orphan.exists()
    assert notes.exists() and fresh.exists() and other.exists()


def test_a_partial_result_goes_beside_the_output(tmp_path) -> None:
    from autopar.base.files import output_target, partial_target

    target = output_target(tmp_path / "plan.json")
    assert partial_target(target).path == tmp_path / "plan.partial.json"
    assert partial_target(output_target(tmp_path / "out")).path == tmp_path / "out.partial"
    long = output_target(tmp_path / ("b" * 250 + ".html"))
    assert len(partial_target(long).path.name) <= 255
    assert partial_target(long).path.name.endswith(".partial.html")
    assert partial_target(output_target("-")).fd == 1


def test_directories_and_sockets_are_refused(tmp_path) -> None:
    import socket

    from autopar.base.files import output_target

    with pytest.raises(OutputError, match="is a directory"):
        output_target(tmp_path)
    path = tmp_path / "s"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        with pytest.raises(OutputError, match="not a regular file"):
            output_target(path)
    finally:
        server.close()
