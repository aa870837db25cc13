"""Writing files the way autopar promises: a regular file atomically (temp file in the same
folder, fsync, then ``os.replace``), so a reader sees the old file or the whole new one, never
half of it; a stream (stdout, a device, a pipe) in place, never renamed over.

What an output path names (``output_target``), as a shell would treat it:

- ``-``, ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``: that descriptor,
  written in place (``> log`` truncates and ``>> log`` appends as the shell opened it; the
  system's ``/dev/stdout`` link is never touched: as root it used to be replaced by a file).
- A regular file, or a symbolic link to one: the file the link names, written atomically (the
  link stays a link). An existing file keeps its permission bits (and owner, where allowed).
- A character device (``/dev/null``) or a named pipe: opened and written in place.
- A directory, a path ending in ``/``, a block device or a socket: refused.

``check_writable`` runs before any work, so a run that cannot deliver its output fails at once
(issue 15). The temp file is removed on every exit path that runs Python code (errors,
``KeyboardInterrupt``, and SIGTERM, which the CLI turns into an exception); only SIGKILL can
orphan one. Temp names carry autopar's marker (``.NAME.<random>.autopar.tmp``, cut to fit the
folder's NAME_MAX) and a later write of the same output removes such orphans once they are older
than ``STALE_TEMP_S``; no other file is ever removed.

Text is encoded as UTF-8 with ``backslashreplace``: a file name that is not UTF-8 (Python holds
its bytes as surrogates) prints as ``\\udcff``, never an exception.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from autopar.base.errors import OutputError

STALE_TEMP_S = 600.0
"""An autopar temp file beside the output older than this is an orphan (a write takes ms)."""
TEMP_MARKER = ".autopar.tmp"
"""The suffix of every temp name autopar makes: the cleanup removes only names with it."""
_RANDOM_CHARS = 8
"""``tempfile.mkstemp`` puts 8 characters from ``[a-z0-9_]`` between prefix and suffix
(CPython ``tempfile._RandomNameSequence``)."""
NAME_MAX_DEFAULT = 255
"""NAME_MAX of Linux, macOS and most file systems, when ``pathconf`` cannot say."""
ENCODING_ERRORS = "backslashreplace"
_FD_PATH = re.compile(r"/dev/fd/(\d+)|/proc/self/fd/(\d+)")
_STD_NAMES = {"-": 1, "/dev/stdout": 1, "/dev/stderr": 2}
_MODE = 0o666


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """Where an output path writes: ``kind`` ``file`` (atomically at ``path``, the resolved
    regular file), ``stream`` (opened in place at ``path``: a device or a named pipe) or ``fd``
    (descriptor ``fd``). ``shown`` is the path as the user wrote it (for messages)."""

    kind: str
    shown: str
    path: Path | None = None
    fd: int | None = None

    @property
    def is_file(self) -> bool:
        return self.kind == "file"


def printable(text: str) -> str:
    """``text`` that every encoder takes: the bytes of a file name that are not UTF-8 (Python
    holds them as surrogates, ``\\udcff``) as ``\\xff``, so a name can go into a YAML file and
    be read back (``all_reduce_\\xff.log``)."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", ENCODING_ERRORS)
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return text.encode("utf-8", ENCODING_ERRORS).decode("utf-8")


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _short(text: str | Path) -> str:
    text = str(text)
    return text if len(text) <= 200 else text[:120] + "..." + text[-40:]


def _os_reason(err: BaseException) -> str:
    if isinstance(err, OSError):
        return (err.strerror or type(err).__name__).lower()
    return type(err).__name__


def _descriptor(text: str) -> int | None:
    """The descriptor a path names the way bash treats it (``-`` is stdout), else None."""
    if text in _STD_NAMES:
        return _STD_NAMES[text]
    match = _FD_PATH.fullmatch(text)
    return int(match.group(1) or match.group(2)) if match else None


def _link_to_descriptor(path: Path) -> int | None:
    """A user's symbolic link (chain) that ends in ``/dev/stdout`` or ``/proc/self/fd/N``."""
    current = path
    for _ in range(40):  # the kernel's own limit on links followed
        fd = _descriptor(str(current))
        if fd is not None:
            return fd
        try:
            current = _folder(current) / os.readlink(current)
        except (OSError, ValueError):  # not a link (or unreadable): a plain path
            return None
    return None


def _check_descriptor(fd: int, where: str) -> None:
    import fcntl

    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        name = "stdout" if fd == 1 else "stderr" if fd == 2 else f"descriptor {fd}"
        raise OutputError(f"{name} is closed; nothing can be written there", source=where) from None
    if flags & os.O_ACCMODE == os.O_RDONLY:
        raise OutputError(f"descriptor {fd} is open for reading only", source=where)


def output_target(path: str | Path, *, source: str = "--output") -> OutputTarget:
    """What ``path`` names (module docstring), checked: raises ``OutputError`` unless it can be
    written (for a file: its folder exists and takes a new file)."""
    text = os.fspath(path)
    where = f"{source} {_short(text)}" if source else _short(text)
    if not text.strip():
        raise OutputError("must name a file, got an empty string", source=source)
    fd = _descriptor(text)
    if fd is None and not text.endswith(("/", os.sep)):
        fd = _link_to_descriptor(Path(text))
    if fd is not None:
        _check_descriptor(fd, where)
        return OutputTarget("fd", text, fd=fd)
    if text.endswith(("/", os.sep)):
        raise OutputError("ends with '/', so it names a directory; name a file", source=where)
    try:
        mode = os.stat(text).st_mode
    except FileNotFoundError:
        mode = None
    except (OSError, ValueError) as err:
        raise OutputError(f"cannot write ({_os_reason(err)})", source=where) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputError("is a directory; name a file", source=where)
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        if not os.access(text, os.W_OK):
            raise OutputError("cannot write (permission denied)", source=where)
        return OutputTarget("stream", text, path=Path(text))
    if mode is not None and not stat.S_ISREG(mode):
        raise OutputError("is not a regular file, a device or a pipe", source=where)
    resolved = Path(os.path.realpath(text)) if os.path.islink(text) else Path(text)
    _probe(resolved, where)
    return OutputTarget("file", text, path=resolved)


def _probe(path: Path, where: str) -> None:
    """The real test: create (and remove) a temp file where the output will go."""
    folder = _folder(path)
    if not folder.is_dir():
        raise OutputError("the directory does not exist", source=where)
    try:
        handle, probe = _make_temp(path)
        os.close(handle)
        os.unlink(probe)
    except (OSError, ValueError) as err:
        raise OutputError(f"cannot write there ({_os_reason(err)})", source=where) from None


def check_writable(path: str | Path, *, source: str = "--output") -> None:
    """Raise ``OutputError`` unless ``path`` can be written (``output_target``)."""
    output_target(path, source=source)


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return NAME_MAX_DEFAULT


def _fit(name: str, budget: int) -> str:
    """``name`` cut to at most ``budget`` bytes as the file system stores it."""
    raw = os.fsencode(name)
    return name if len(raw) <= budget else os.fsdecode(raw[: max(1, budget)])


def _temp_stem(path: Path) -> str:
    """The part of the output's name in its temp name, cut so that ``.STEM.<random>`` plus the
    marker fits NAME_MAX (a 250-byte output name used to fail: "file name too long")."""
    budget = _name_max(_folder(path)) - 2 - _RANDOM_CHARS - len(TEMP_MARKER)
    return _fit(path.name, budget)


def _make_temp(path: Path) -> tuple[int, str]:
    prefix = f".{_temp_stem(path)}."
    return tempfile.mkstemp(dir=_folder(path), prefix=prefix, suffix=TEMP_MARKER)


def _umask() -> int:
    """The process umask (read by setting it and putting it back: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd``. A pipe whose reader goes away mid-write returns a short
    count first; ``BufferedWriter`` reported that count and ``TextIOWrapper`` dropped the rest
    silently (a 4.8 MB page piped to ``head -c 100`` exited 0). Looping, the next write raises
    ``BrokenPipeError``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_stream(stream: TextIO | None, text: str, *, name: str = "stdout") -> None:
    """``text`` to a text stream (stdout, stderr), every byte or an exception; ``None`` (Python
    found the descriptor closed at start) is an ``OutputError``."""
    if stream is None:
        raise OutputError(f"{name} is closed; nothing can be written there (use --output FILE)")
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a stream in memory (tests, notebooks)
        stream.write(text.encode("utf-8", ENCODING_ERRORS).decode("utf-8"))
        stream.flush()
        return
    stream.flush()
    write_all(fd, text.encode(stream.encoding or "utf-8", ENCODING_ERRORS))


def _write_descriptor(target: OutputTarget, text: str) -> None:
    import sys

    if target.fd in (1, 2):
        stream = sys.stdout if target.fd == 1 else sys.stderr
        write_stream(stream, text, name="stdout" if target.fd == 1 else "stderr")
    else:
        write_all(target.fd, text.encode("utf-8", ENCODING_ERRORS))


def _write_in_place(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)
    try:
        write_all(fd, text.encode("utf-8", ENCODING_ERRORS))
    finally:
        os.close(fd)


def _keep_owner_and_mode(fd: int, old: os.stat_result | None) -> None:
    """An existing file keeps its permission bits (``chmod 600`` stays 600) and, where this
    process may, its owner; a new one gets what a plain ``open()`` gives (0666 & ~umask)."""
    if old is None:
        os.fchmod(fd, _MODE & ~_umask())
        return
    if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(OSError):
            os.fchown(fd, old.st_uid, old.st_gid)
    os.fchmod(fd, stat.S_IMODE(old.st_mode))


def _write_file(path: Path, text: str) -> None:
    _remove_stale_temps(path)
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    temp: str | None = None
    try:
        handle, temp = _make_temp(path)
        try:
            write_all(handle, text.encode("utf-8", ENCODING_ERRORS))
            _keep_owner_and_mode(handle, old)
            os.fsync(handle)
        finally:
            os.close(handle)
        os.replace(temp, path)
        temp = None
    finally:  # every exit path, KeyboardInterrupt and the CLI's SIGTERM exception included
        if temp is not None:
            Path(temp).unlink(missing_ok=True)


def write_atomic(path: str | Path | OutputTarget, text: str) -> None:
    """Write ``text`` to ``path`` (an ``OutputTarget`` or a path: module docstring): a regular
    file atomically, a stream in place. An I/O failure is an ``OutputError``; a reader of a
    pipe going away is ``BrokenPipeError`` (the CLI ends quietly with 141)."""
    target = path if isinstance(path, OutputTarget) else output_target(path, source="")
    try:
        if target.kind == "fd":
            _write_descriptor(target, text)
        elif target.kind == "stream":
            _write_in_place(target.path, text)
        else:
            _write_file(target.path, text)
    except BrokenPipeError:
        raise
    except OSError as err:
        if isinstance(err, OutputError):
            raise
        where = _short(target.shown)
        raise OutputError(f"cannot write ({_os_reason(err)})", source=where) from None


def partial_target(target: OutputTarget) -> OutputTarget:
    """Where an incomplete result goes: beside a file, as ``NAME.partial.EXT`` (``plan.json`` ->
    ``plan.partial.json``, ``out`` -> ``out.partial``), so it never replaces a complete one; a
    stream or descriptor gets it in place (there is nothing there to keep)."""
    if not target.is_file:
        return target
    path = target.path
    suffix = path.suffix if path.stem else ""
    stem = path.name[: len(path.name) - len(suffix)] if suffix else path.name
    budget = _name_max(_folder(path)) - len(os.fsencode(f".partial{suffix}"))
    partial = path.with_name(f"{_fit(stem, budget)}.partial{suffix}")
    return OutputTarget("file", str(partial), path=partial)


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one existing file (through links); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _remove_stale_temps(path: Path) -> None:
    """Orphans of this output left by a killed run (SIGKILL cannot be caught): only names of
    autopar's own pattern, ``.STEM.<random>.autopar.tmp`` (a user's ``.plan.json.notes.tmp``
    was removed too, before)."""
    pattern = re.compile(
        rf"\.{re.escape(_temp_stem(path))}\.[a-z0-9_]{{{_RANDOM_CHARS}}}{re.escape(TEMP_MARKER)}"
    )
    cutoff = time.time() - STALE_TEMP_S
    try:
        with os.scandir(_folder(path)) as entries:
            for entry in entries:
                if not pattern.fullmatch(entry.name):
                    continue
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(info.st_mode) and info.st_mtime < cutoff:
                    os.unlink(entry.path)
    except OSError:
        pass  # best effort: an orphan never blocks a write (temp names are random)
