"""Writing files the way autopar promises: atomically (temp file in the same folder, fsync, then
``os.replace``), so a reader sees the old file or the whole new one, never half of it.

``check_writable`` runs before any work, so a run that cannot deliver its output fails at once
(issue 15). The temp file is removed on every exit path that runs Python code (errors,
``KeyboardInterrupt``, and SIGTERM, which the CLI turns into an exception); only SIGKILL can
orphan one, and its random name never blocks a later run, which also removes orphans of its own
output older than ``STALE_TEMP_S``.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path

from autopar.base.errors import OutputError

STALE_TEMP_S = 600.0
"""A ``.<name>.*.tmp`` beside the output older than this is an orphan (a write takes ms)."""


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _reason(err: OSError) -> str:
    return (err.strerror or type(err).__name__).lower()


def check_writable(path: str | Path, *, source: str = "--output") -> None:
    """Raise ``OutputError`` unless ``path`` can be written atomically: its folder exists and
    takes a new file, and ``path`` is not a directory or other non-regular file."""
    if not str(path).strip():
        raise OutputError("must name a file, got an empty string", source=source)
    path = Path(path)
    where = f"{source} {_short(path)}" if source else _short(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except (OSError, ValueError) as err:
        raise OutputError(f"cannot write ({_os_reason(err)})", source=where) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputError("is a directory; name a file", source=where)
    if mode is not None and not stat.S_ISREG(mode):
        raise OutputError("is not a regular file", source=where)
    folder = _folder(path)
    if not folder.is_dir():
        raise OutputError("the directory does not exist", source=where)
    try:  # the real test: create (and remove) a temp file where the output will go
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        os.close(handle)
        os.unlink(probe)
    except (OSError, ValueError) as err:
        raise OutputError(f"cannot write there ({_os_reason(err)})", source=where) from None


_MODE = 0o666


def _umask() -> int:
    """The process umask (read by setting it and putting it back: there is no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; an I/O failure is an ``OutputError``."""
    check_writable(path, source="")
    path = Path(path)
    folder = _folder(path)
    _remove_stale_temps(folder, path.name)
    temp: str | None = None
    try:
        handle, temp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            # mkstemp makes the file 0600; give it the mode a plain open() would (0666 & ~umask)
            os.fchmod(stream.fileno(), _MODE & ~_umask())
            os.fsync(stream.fileno())
        os.replace(temp, path)
        temp = None
    except OSError as err:
        raise OutputError(f"cannot write ({_os_reason(err)})", source=_short(path)) from None
    finally:  # every exit path, KeyboardInterrupt and the CLI's SIGTERM exception included
        if temp is not None:
            Path(temp).unlink(missing_ok=True)


def _remove_stale_temps(folder: Path, name: str) -> None:
    """Orphans of this output left by a killed run (SIGKILL cannot be caught)."""
    cutoff = time.time() - STALE_TEMP_S
    try:
        for orphan in folder.glob(f".{_glob_escape(name)}.*.tmp"):
            if orphan.is_file() and orphan.stat().st_mtime < cutoff:
                orphan.unlink(missing_ok=True)
    except OSError:
        pass  # best effort: an orphan never blocks a write (temp names are random)


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _os_reason(err: BaseException) -> str:
    return _reason(err) if isinstance(err, OSError) else type(err).__name__


def _short(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 200 else text[:120] + "..." + text[-40:]
