"""Writes that lose nothing, names that stay in their folder (core.files)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradscope.core import files
from gradscope.core.files import (
    MAX_NAME_BYTES,
    TEMP_SUFFIX,
    FileWriteError,
    inside,
    remove_stale_temps,
    safe_file_name,
    shorten,
    write_files_atomic,
    write_text_atomic,
)


@pytest.mark.parametrize(
    "name",
    [
        "../../../victimdir/settings",
        "/etc/passwd",
        "a/b\\c",
        "..",
        ".",
        "...hidden",
        "nul\x00byte",
        "tab\tand\nnewline",
        "x" * 100_000,
        "é" * 300,
        "CON",
        "",
        "   ",
        'what?*<>|":',
    ],
)
def test_a_safe_file_name_stays_in_its_folder(tmp_path, name):
    safe = safe_file_name(name)
    assert safe and "/" not in safe and "\\" not in safe and "\x00" not in safe
    assert not safe.startswith(".") and len(safe.encode("utf-8")) <= MAX_NAME_BYTES
    assert all(ord(c) >= 32 for c in safe)
    path = inside(tmp_path, safe + ".png")
    assert path.parent == tmp_path and path.resolve().parent == tmp_path.resolve()
    path.write_bytes(b"x")  # a name the file system takes
    assert path.read_bytes() == b"x"


def test_safe_names_keep_what_is_safe():
    assert safe_file_name("cat_guided backprop") == "cat_guided backprop"
    assert safe_file_name("κατάλογος-日本") == "κατάλογος-日本"
    assert safe_file_name("../../x") == "x"
    with pytest.raises(FileWriteError, match="not a plain file name"):
        inside(Path("out"), "../x.png")


def test_shorten_bounds_and_escapes():
    assert shorten("x" * 1000) == "x" * 79 + "…"
    assert shorten("a\x00b\nc") == "a\\x00b\\nc"
    assert shorten("é") == "é"


def test_files_written_together_are_all_or_none(tmp_path, monkeypatch):
    png, sidecar = tmp_path / "o.png", tmp_path / "o.json"
    png.write_bytes(b"old png")
    sidecar.write_text("old json")
    calls = []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 2:  # the second file's write fails: a full disk
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", fsync)
    with pytest.raises(FileWriteError, match="o.json: No space left.*left as it was"):
        write_files_atomic([(png, lambda f: f.write(b"new png")), (sidecar, lambda f: f.write(b"new json"))])
    assert png.read_bytes() == b"old png" and sidecar.read_text() == "old json"  # the PNG was not replaced alone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.json", "o.png"]  # no temporary file left


def test_a_folder_is_not_a_file_to_write(tmp_path):
    with pytest.raises(FileWriteError, match="is a folder"):
        write_text_atomic(tmp_path, "x")


def test_temporary_files_of_a_killed_write_are_removed_by_the_next_write(tmp_path):
    """A SIGKILL between the temporary file and the rename leaves ``.<name>.<pid>.<random>.gstmp``; the next write
    into the folder removes it (its process is gone). A live process's temp and other programs' files stay."""
    script = (
        "import os, sys\n"
        "from gradscope.core.files import write_atomic\n"
        "def write(fh):\n"
        "    fh.write(b'half')\n"
        "    fh.flush()\n"
        "    os.kill(os.getpid(), 9)\n"
        f"write_atomic({str(tmp_path / 'o.png')!r}, write)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".o.png.") and left[0].endswith(TEMP_SUFFIX)
    live = tmp_path / f".x.png.{os.getppid()}.abc{TEMP_SUFFIX}"  # a running process's write in progress
    live.write_bytes(b"")
    other = tmp_path / ".o.png.123.tmp"  # not ours
    other.write_bytes(b"")
    write_text_atomic(tmp_path / "o.png", "whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, "o.png"])
    assert remove_stale_temps(tmp_path) == []
