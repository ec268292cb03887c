"""Reading a ``.keras`` archive's members: each member checked against decompression bombs, and the weights
read in place through a memory map when they are stored uncompressed (as Keras writes them)."""

from __future__ import annotations

import contextlib
import io
import mmap
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gradscope.core.errors import ModelLoadError

WEIGHTS = "model.weights.h5"


def refuse_zip_bomb(info: zipfile.ZipInfo, p: Path) -> None:
    """Keras's own guard (CWE-409), on every member gradscope reads itself: a member that claims gigabytes
    it does not store."""
    if info.file_size > 1 << 32 and info.file_size > 100 * info.compress_size:
        raise ModelLoadError(
            f"{p} is not loaded: its {info.filename} claims {info.file_size} bytes but only "
            f"{info.compress_size} are stored (a decompression bomb?)."
        )


@contextlib.contextmanager
def weights_store(saving_lib: Any, p: Path, model: Any) -> Iterator[Any]:
    """Keras's reader of the archive's weights. An uncompressed member (what Keras writes) is read in place
    through a memory map: each array is copied once, from the file into its tensor."""
    with p.open("rb") as f, zipfile.ZipFile(f) as zf:
        info = zf.getinfo(WEIGHTS)
        if info.compress_type == zipfile.ZIP_STORED and info.file_size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                store = saving_lib.H5IOStore(_MemberView(mapped, _member_start(f, info), info.file_size), mode="r")
                try:
                    yield store
                finally:
                    store.close()
            return
        # As Keras does: a compressed member read into memory when it fits, else read from the archive as needed
        # (slower; Keras would extract it beside the model, and gradscope writes nothing there).
        if getattr(saving_lib, "is_memory_sufficient", lambda _model: True)(model):
            store = saving_lib.H5IOStore(io.BytesIO(read_member(zf, WEIGHTS, p)), mode="r")
        else:
            refuse_zip_bomb(info, p)
            store = saving_lib.H5IOStore(WEIGHTS, archive=zf, mode="r")
        try:
            yield store
        finally:
            store.close()


def _member_start(f: Any, info: zipfile.ZipInfo) -> int:
    """Where an archive member's bytes start: after its local header, whose extra field may differ in length
    from the central directory's."""
    f.seek(info.header_offset)
    header = f.read(30)
    if header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"no local header for {info.filename}")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_length + extra_length


class _MemberView(io.BytesIO):
    """A read-only file over ``size`` bytes of a memory map from ``start``. An ``io.BytesIO`` only because
    Keras's ``H5IOStore`` accepts no other file object; h5py reads it through ``readinto``/``seek``."""

    def __init__(self, mapped: mmap.mmap, start: int, size: int) -> None:
        super().__init__()
        if start + size > len(mapped):
            raise zipfile.BadZipFile("an archive member runs past the end of the file")
        self._mapped, self._start, self._size, self._pos = mapped, start, size, 0

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        begin = self._start + self._pos
        view[:n] = self._mapped[begin : begin + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        left = self._size - self._pos
        n = left if size is None or size < 0 else max(0, min(size, left))
        begin = self._start + self._pos
        self._pos += n
        return self._mapped[begin : begin + n]

    def write(self, data: Any) -> int:
        raise io.UnsupportedOperation("read-only")


def read_member(zf: zipfile.ZipFile, name: str, p: Path) -> bytes:
    refuse_zip_bomb(zf.getinfo(name), p)
    return zf.read(name)
