"""Reading array inputs (``.npy``, ``.npz``) safely: sized from their headers before anything is read, never
unpickled."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gradscope.core.errors import InputError

MAX_INPUT_BYTES = 2 << 30  # an array input is checked before it is read: 2 GiB is far past any batch here


def check_input_size(name: str, nbytes: int) -> None:
    if nbytes > MAX_INPUT_BYTES:
        raise InputError(
            f"{name} holds {nbytes / 2**30:.1f} GiB; gradscope reads array inputs up to "
            f"{MAX_INPUT_BYTES / 2**30:.0f} GiB. Pass a smaller batch."
        )


def npy_nbytes(path: Path) -> int:
    """The size a .npy file's header promises (0 when it has no readable header: np.load then says why)."""
    try:
        with path.open("rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
    except (OSError, ValueError):
        return 0
    return int(np.prod(shape, dtype=np.float64)) * dtype.itemsize


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of a ``.npy`` (named after the file's stem) or ``.npz`` file, by name, in file order."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"Input file not found: {p}")
    if p.suffix.lower() == ".npy":
        check_input_size(p.name, npy_nbytes(p))  # from the header, before anything is mapped
    try:
        loaded = np.load(p, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"Cannot read {p.name} as a NumPy array: {exc}") from None
    if isinstance(loaded, np.ndarray):
        return {p.stem: np.array(loaded)}
    with loaded:
        out = {}
        for k in loaded.files:
            check_input_size(f"{p.name}[{k}]", loaded.zip.getinfo(f"{k}.npy").file_size)
            try:
                out[k] = loaded[k]
            except ValueError as exc:  # an object array: never unpickled
                raise InputError(f"Cannot read {p.name}[{k}] as a NumPy array: {exc}") from None
        return out
