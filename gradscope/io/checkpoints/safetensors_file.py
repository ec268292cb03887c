"""Safetensors files read tensor by tensor into memory of the reader's own, for keras_hub's converters.

``safetensors.safe_open`` maps the whole file; every page a converter reads stays mapped into the process until the
file is closed, at the end of the open, so a 2.5 GB bfloat16 checkpoint's pages sat in the process' RSS beside the
2.5 GB of variables made from them (peak 5.7 GB for a 1 B Llama). Here each tensor is read with one ``readinto``
into an array that is dropped once its variable holds it: the peak is the variables and one tensor. The format (an
8-byte header length, a JSON header of dtype, shape and byte range per tensor, then the bytes) is checked before
any byte is read: every range inside the file and as long as its shape says. ``safetensors`` stays the reference
in the tests.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import ModelLoadError
from gradscope.core.files import shorten

MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
_ONE_AT_A_TIME = threading.Lock()


def _dtypes() -> dict[str, Any]:
    import ml_dtypes

    return {
        "F64": np.float64,
        "F32": np.float32,
        "F16": np.float16,
        "BF16": ml_dtypes.bfloat16,
        "F8_E4M3": ml_dtypes.float8_e4m3fn,
        "F8_E5M2": ml_dtypes.float8_e5m2,
        "I64": np.int64,
        "I32": np.int32,
        "I16": np.int16,
        "I8": np.int8,
        "U64": np.uint64,
        "U32": np.uint32,
        "U16": np.uint16,
        "U8": np.uint8,
        "BOOL": np.bool_,
    }


class SafetensorsFile:
    """One ``.safetensors`` file: ``keys()`` and ``get_tensor(name)`` as ``safe_open(path, framework="np")`` has
    them, each tensor a fresh little-endian numpy array."""

    def __init__(self, path: str | os.PathLike[str], on_read: Callable[[int], None] | None = None) -> None:
        self.path = Path(path)
        self._on_read = on_read
        self._file = open(self.path, "rb", buffering=0)  # noqa: SIM115 - closed by close(); unbuffered: one copy
        try:
            self._entries, self._data_start = self._read_header()
        except BaseException:
            self._file.close()
            raise

    def _fail(self, why: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path} is not a safetensors file keras_hub can read: {shorten(why, 300)}.")

    def _read_header(self) -> tuple[dict[str, tuple[Any, tuple[int, ...], int, int]], int]:
        size = os.fstat(self._file.fileno()).st_size
        head = self._file.read(8)
        if len(head) < 8:
            raise self._fail("shorter than its 8-byte header length")
        length = int.from_bytes(head, "little")
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise self._fail(f"its header says {length} bytes; the file has {size}")
        try:
            header = json.loads(self._file.read(length))
        except (ValueError, RecursionError) as exc:
            raise self._fail(f"its header is not JSON ({exc})") from exc
        if not isinstance(header, dict):
            raise self._fail("its header is not a JSON object")
        dtypes, start = _dtypes(), 8 + length
        entries = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype = np.dtype(dtypes[entry["dtype"]])
                shape = tuple(int(n) for n in entry["shape"])
                begin, end = (int(n) for n in entry["data_offsets"])
            except (KeyError, TypeError, ValueError) as exc:
                raise self._fail(
                    f"tensor {shorten(repr(name))} has no dtype, shape and data_offsets it can read ({exc!r})"
                ) from exc
            if min(shape, default=0) < 0 or not 0 <= begin <= end or start + end > size:
                raise self._fail(
                    f"tensor {shorten(repr(name))} lies outside the file (bytes {begin}..{end} of {size - start})"
                )
            if end - begin != math.prod(shape) * dtype.itemsize:
                raise self._fail(
                    f"tensor {shorten(repr(name))} has {end - begin} bytes for a {entry['dtype']} of shape {shape}"
                )
            entries[name] = (dtype, shape, start + begin, end - begin)
        return entries, start

    def keys(self) -> list[str]:
        return list(self._entries)

    def get_tensor(self, name: str) -> np.ndarray:
        dtype, shape, offset, length = self._entries[name]
        from gradscope.backend import aligned_empty  # read where TensorFlow can take it over as it lies

        array = aligned_empty(shape, dtype.newbyteorder("<"))
        self._file.seek(offset)
        if self._file.readinto(memoryview(array.reshape(-1).view(np.uint8))) != length:
            raise self._fail(f"tensor {shorten(repr(name))} ends early (the file changed while it was read)")
        if self._on_read is not None:
            self._on_read(length)
        return array

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def safe_open(
    path: str | os.PathLike[str],
    framework: str = "np",
    device: str = "cpu",
    *,
    on_read: Callable[[int], None] | None = None,
) -> SafetensorsFile:
    """``safetensors.safe_open`` for numpy on the CPU, the only way keras_hub's converters call it."""
    if framework not in ("np", "numpy") or device != "cpu":
        raise ValueError(f"gradscope reads safetensors as numpy on the CPU, not framework={framework!r} on {device!r}")
    return SafetensorsFile(path, on_read)


@contextlib.contextmanager
def read_by_tensor(on_read: Callable[[int], None] | None = None) -> Iterator[None]:
    """Inside: keras_hub's converters read safetensors files through :class:`SafetensorsFile`, calling
    ``on_read(bytes)`` after each tensor (it may raise: the open stops there)."""
    import types

    try:
        from keras_hub.src.utils.transformers import convert_gemma3, safetensor_utils
    except ImportError:  # another keras_hub layout: its own reader
        yield
        return
    with _ONE_AT_A_TIME:
        saved = safetensor_utils.safetensors, convert_gemma3.safe_open
        opened = functools.partial(safe_open, on_read=on_read)
        safetensor_utils.safetensors = types.SimpleNamespace(safe_open=opened)
        convert_gemma3.safe_open = opened
        try:
            yield
        finally:
            safetensor_utils.safetensors, convert_gemma3.safe_open = saved
