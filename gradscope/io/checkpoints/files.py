"""The files of a checkpoint folder that keras_hub will read, checked before it reads any: each a regular file
(a FIFO named ``model.safetensors`` blocked the read forever; ``vocab.json -> /dev/zero`` grew to 5.4 GB), of a
size its kind can have, and the weight files a sharded index names confined to the folder (an index naming
``/abs/x.safetensors`` or ``../outside/x.safetensors`` loaded weights from elsewhere; ``../../etc/passwd`` was
opened). Links inside the folder are followed: a Hugging Face cache's snapshot folder is links to its blobs."""

from __future__ import annotations

import stat
from pathlib import Path, PurePosixPath
from typing import Any

from gradscope.core.errors import ModelLoadError
from gradscope.core.files import shorten
from gradscope.core.json_text import read_json_file

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
WEIGHTS = "model.safetensors"
MAX_CONFIG_BYTES = 16 << 20  # a config is a few KiB; an index of 10,000 tensors about 1 MiB
MAX_TEXT_BYTES = 256 << 20  # tokenizer files: Gemma 3's tokenizer.json is 33 MB
#: Files keras_hub's converters and preset loaders open by name: configs, tokenizer data, weights.
READ_SUFFIXES = (".json", ".txt", ".model", ".safetensors", ".h5")
_TEXT_SUFFIXES = (".json", ".txt", ".model")


def read_config(folder: Path) -> dict[str, Any] | None:
    """``config.json`` of a folder as a dict; None where the folder has none (or it is not an object). One line
    for a config that cannot be read: not a regular file, over ``MAX_CONFIG_BYTES``, nested past any config,
    not UTF-8 or not JSON."""
    path = folder / CONFIG
    if not path.exists() and not path.is_symlink():
        return None
    config = read_json_file(path, "checkpoint config", ModelLoadError, max_bytes=MAX_CONFIG_BYTES)
    return config if isinstance(config, dict) else None


def check_folder_files(folder: Path) -> None:
    """Every file keras_hub may open in ``folder`` (its top level and ``assets/``) is a regular file, and
    configs and tokenizer files are at most ``MAX_TEXT_BYTES``: else ``ModelLoadError`` naming it."""
    found = [p for p in folder.iterdir() if p.suffix.lower() in READ_SUFFIXES]
    assets = folder / "assets"
    if assets.is_dir():
        found += [p for p in assets.rglob("*") if p.suffix.lower() in READ_SUFFIXES]
    for path in found:
        _check_regular(folder, path)
        if path.suffix.lower() in _TEXT_SUFFIXES and path.stat().st_size > MAX_TEXT_BYTES:
            raise ModelLoadError(
                f"{folder}: {path.name} is {path.stat().st_size >> 20} MiB; a config or tokenizer file is at most "
                f"{MAX_TEXT_BYTES >> 20} MiB."
            )


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files a Hugging Face folder's weights are read from: the shards its index names (each name
    a relative path that stays inside the folder, to a regular file that exists), else ``model.safetensors``."""
    index = folder / INDEX
    if not index.exists() and not index.is_symlink():
        path = folder / WEIGHTS
        if not path.exists():
            shards = sorted(p.name for p in folder.glob("*.safetensors"))
            raise ModelLoadError(
                f"{folder} has no {WEIGHTS}"
                + (f" and no {INDEX} to say which tensor is in which of {', '.join(shards[:3])}." if shards else ".")
            )
        _check_regular(folder, path)
        return [path]
    data = read_json_file(index, "weight index", ModelLoadError, max_bytes=MAX_CONFIG_BYTES)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{folder}: {INDEX} has no weight_map (an object: tensor name -> file name).")
    names = set()
    for tensor, name in weight_map.items():
        if not isinstance(name, str):
            raise ModelLoadError(f"{folder}: {INDEX} names the file of {shorten(tensor)!r} as {shorten(repr(name))}.")
        names.add(name)
    files = []
    for name in sorted(names):
        path = _confined(folder, name)
        if not path.exists() and not path.is_symlink():
            raise ModelLoadError(f"{folder}: {INDEX} names {shorten(name)!r}, which the folder does not have.")
        _check_regular(folder, path)
        files.append(path)
    return files


def _confined(folder: Path, name: str) -> Path:
    """``folder / name`` for a relative name that never leaves the folder (no ``..``, no absolute path, no drive
    or NUL); ``ModelLoadError`` otherwise."""
    parts = PurePosixPath(name).parts
    if not name or "\0" in name or "\\" in name or PurePosixPath(name).is_absolute() or ".." in parts:
        raise ModelLoadError(
            f"{folder}: {INDEX} names the weight file {shorten(name)!r}, which is not inside the folder; a sharded "
            "checkpoint's index names files of its own folder."
        )
    return folder.joinpath(*parts)


def _check_regular(folder: Path, path: Path) -> None:
    try:
        mode = path.stat().st_mode  # follows links: a cache's link to its blob is a regular file
    except OSError as exc:
        raise ModelLoadError(f"{folder}: cannot read {path.name} ({exc.strerror or exc}).") from None
    if not stat.S_ISREG(mode):
        raise ModelLoadError(
            f"{folder}: {path.relative_to(folder)} is not a regular file (a FIFO, device or folder); gradscope reads "
            "only regular files in a checkpoint folder."
        )
