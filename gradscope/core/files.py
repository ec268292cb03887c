"""Writing files so that nothing the user owns is lost, and naming them so that nothing lands elsewhere.

- ``write_atomic`` / ``write_files_atomic``: temporary files beside the targets, each written in full and
  synced, then renamed over them: an interrupted or failed write (a full disk) leaves every old file as it was,
  and a PNG is never left without its sidecar (nor a sidecar without its PNG). A temporary file a killed
  process left behind is removed by the next write into that folder.
- ``safe_file_name``: a name from data (a plan's name, an image's stem, a method) reduced to one file name
  that cannot leave its folder: no separators, no ``..``, no NUL or control characters, bounded length.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from gradscope.core.errors import GradscopeError


class FileWriteError(GradscopeError):
    """A file could not be written (full disk, no permission); the previous file, if any, is untouched."""


#: Temporary files end in this, with the writer's process id in their name: ``.<name>.<pid>.<random>.gstmp``.
TEMP_SUFFIX = ".gstmp"
_TEMP = re.compile(r"^\..+\.(\d+)\.[^.]+" + re.escape(TEMP_SUFFIX) + "$")
#: A temporary file of a live process is left alone unless it is older than this (a process id reused).
STALE_AFTER_S = 24 * 3600.0

Writer = Callable[[IO[bytes]], None]


def write_atomic(path: str | Path, write: Writer) -> Path:
    """Write a file through ``write(fh)`` into a temporary file beside it, then rename it over ``path``."""
    return write_files_atomic([(path, write)])[0]


def write_text_atomic(path: str | Path, text: str) -> Path:
    """A UTF-8 text file (plan, session, sidecar, CSV) written atomically."""
    data = text.encode("utf-8")
    return write_atomic(path, lambda fh: fh.write(data))


def write_files_atomic(files: Sequence[tuple[str | Path, Writer]]) -> list[Path]:
    """Write files that belong together (a PNG and its sidecar): every one is written in full to a temporary
    file first, and only then are they renamed over their targets, so a failure leaves all of them as they were.
    Raises ``FileWriteError`` naming the file that could not be written."""
    paths = [Path(p) for p, _ in files]
    for path in paths:
        if path.is_dir():
            raise FileWriteError(f"Cannot write {path}: it is a folder; give a file name.")
    temps: list[Path] = []
    current = paths[0] if paths else Path()
    try:
        for path, (_, write) in zip(paths, files):
            current = path
            remove_stale_temps(path.parent)
            temps.append(_write_temp(path, write))
        for tmp, path in zip(temps, paths):
            current = path
            os.replace(tmp, path)
    except OSError as exc:
        kept = " The existing file was left as it was." if current.exists() else ""
        raise FileWriteError(f"Cannot write {current}: {exc.strerror or exc}.{kept}") from exc
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)  # after a rename there is nothing left to remove
    mode = 0o666 & ~_umask()  # mkstemp makes 0600; a picture is shared like any file the user saves
    for path in paths:
        os.chmod(path, mode)
    return paths


def _write_temp(path: Path, write: Writer) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Remove the temporary files of writes that never finished (the writing process was killed): those whose
    process no longer runs, or older than ``STALE_AFTER_S``. Never another program's files (only ``.gstmp``),
    never a write in progress in this process. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        match = _TEMP.match(entry.name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_AFTER_S
            if pid == os.getpid() or (_alive(pid) and not old):
                continue
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process: leave its files alone
    return True


def _umask() -> int:
    """The process umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        return 0o022


# ------------------------------------------------------------------------------------------------ file names
#: Longest file name this writes, in UTF-8 bytes (file systems allow 255; a suffix and a number still fit).
MAX_NAME_BYTES = 120
_UNSAFE = re.compile(r'[\x00-\x1f\x7f/\\:*?"<>|]+')
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)), *(f"LPT{i}" for i in range(1, 10))}


def safe_file_name(name: str, fallback: str = "unnamed", max_bytes: int = MAX_NAME_BYTES) -> str:
    """``name`` as one file name that stays in its folder: path separators, NUL, control characters and the
    characters Windows refuses become ``_``; leading dots and spaces go (no ``..``, no hidden file); the name is
    cut to ``max_bytes`` of UTF-8 at a character boundary. Empty (or all unsafe) gives ``fallback``."""
    text = unicodedata.normalize("NFC", str(name))
    parts = [p.strip(" .") for p in _UNSAFE.split(text)]  # "../../x": "..", "..", "x"; a part of dots is nothing
    text = "_".join(p for p in parts if p).strip(" ._") or fallback
    if text.split(".")[0].upper() in _RESERVED:
        text = f"_{text}"
    data = text.encode("utf-8")
    if len(data) > max_bytes:
        text = data[:max_bytes].decode("utf-8", errors="ignore").rstrip(" .")
    return text or fallback


def is_file_named(text: str | Path) -> bool:
    """Whether a user's string names an existing file. A string no file can be named by (a prompt of 300
    characters without a ``/``, a NUL) names none, where ``Path.is_file`` raised "File name too long"."""
    try:
        return Path(text).expanduser().is_file()
    except (OSError, ValueError):
        return False


def inside(folder: str | Path, name: str) -> Path:
    """``folder / name`` after checking the result is directly inside ``folder`` (a last guard: names are made
    safe before they get here)."""
    base = Path(folder)
    path = base / name
    if path.parent != base or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise FileWriteError(f"Refusing to write {name!r}: not a plain file name inside {base}.")
    return path


def shorten(text: str, limit: int = 80) -> str:
    """A user-given string as it may appear in a message: at most ``limit`` characters, control characters
    shown escaped (a 100 MB plan name is not printed in full)."""
    text = str(text)
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), cut)
