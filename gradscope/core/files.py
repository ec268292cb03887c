"""Writing files so that nothing the user owns is lost: a temporary file beside the target, then a rename."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from gradscope.core.errors import GradscopeError


class FileWriteError(GradscopeError):
    """A file could not be written (full disk, no permission); the previous file, if any, is untouched."""


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Write a file through ``write(fh)`` into a temporary file beside it, then rename it over ``path``: an
    interrupted or failed write (a full disk) leaves the old file as it was."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise FileWriteError(f"Cannot write {path}: {exc.strerror or exc}.") from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        kept = " The existing file was left as it was." if path.exists() else ""
        raise FileWriteError(f"Cannot write {path}: {exc.strerror or exc}.{kept}") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    os.chmod(path, 0o666 & ~_umask())  # mkstemp makes 0600; a picture is shared like any file the user saves
    return path


def _umask() -> int:
    """The process umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        return 0o022


def write_text_atomic(path: str | Path, text: str) -> Path:
    """A UTF-8 text file (plan, session, sidecar) written atomically."""
    data = text.encode("utf-8")
    return write_atomic(path, lambda fh: fh.write(data))
