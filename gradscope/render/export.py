"""PNG export with a JSON sidecar that says how the picture was made (model, target, plan, view).

Both files are written atomically (temporary file in the same folder, then ``os.replace``) so an interrupted
export never leaves a truncated PNG or half a sidecar behind; the sidecar is serialised before anything is
written, so a value that cannot be stored fails the export cleanly.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gradscope.core.files import Writer, write_files_atomic
from gradscope.core.formats import SIDECAR_SCHEMA
from gradscope.core.json_text import read_json_file


def sidecar_path(path: str | Path) -> Path:
    """Where the sidecar of the PNG at ``path`` lives: the same name with ``.json``."""
    return Path(path).with_suffix(".json")


def _version() -> str:
    try:
        import gradscope

        return str(getattr(gradscope, "__version__", "unknown"))
    except Exception:  # noqa: BLE001 - a version string must never stop an export
        return "unknown"


def _jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy scalars/arrays, paths, sets and dataclasses converted; NaN/Inf as strings."""
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(_jsonable(k)): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((_jsonable(v) for v in obj), key=repr)
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")  # strict JSON has none
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "to_dict"):
        return _jsonable(obj.to_dict())
    raise TypeError(f"Cannot store a {type(obj).__name__} in the sidecar: {obj!r}")


def save_png(
    path: str | Path,
    rgb_uint8: np.ndarray,
    sidecar: dict[str, Any] | None = None,
    companions: Sequence[tuple[Path, Writer]] = (),
) -> Path:
    """Write ``rgb_uint8`` ((H, W), (H, W, 3) or (H, W, 4) uint8) as PNG, plus ``sidecar`` as JSON beside it
    and any ``companions`` (a scores table), all or none (``write_files_atomic``).

    The sidecar gets ``schema`` and ``gradscope_version`` fields. Missing parent folders are created.
    Returns the PNG path.
    """
    path = Path(path)
    if path.suffix.lower() == ".json":
        raise ValueError(f"{path}: the PNG cannot have a .json suffix, the sidecar goes there.")
    a = np.asarray(rgb_uint8)
    if a.dtype != np.uint8:
        raise ValueError(f"save_png expects uint8 pixels, got {a.dtype}; render the map with blend() first.")
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[-1] in (3, 4))):
        raise ValueError(f"save_png expects (H, W), (H, W, 3) or (H, W, 4) pixels, got shape {a.shape}.")
    text = None if sidecar is None else sidecar_text(sidecar)  # before anything is written: it may fail
    path.parent.mkdir(parents=True, exist_ok=True)
    picture = Image.fromarray(np.ascontiguousarray(a))
    files: list[tuple[Path, Writer]] = [(path, lambda fh: picture.save(fh, format="PNG"))]
    if text is not None:
        data = text.encode("utf-8")
        files.append((sidecar_path(path), lambda fh: fh.write(data)))
    write_files_atomic([*files, *companions])
    return path


def sidecar_text(sidecar: dict[str, Any]) -> str:
    """The JSON of a sidecar, with its ``schema`` and ``gradscope_version`` fields (every export's sidecar)."""
    meta = {**_jsonable(dict(sidecar)), "schema": SIDECAR_SCHEMA, "gradscope_version": _version()}
    return json.dumps(meta, indent=2, sort_keys=True, allow_nan=False) + "\n"


def load_sidecar(path: str | Path) -> dict[str, Any]:
    """The sidecar of a PNG (pass the PNG or the JSON path)."""
    p = Path(path)
    p = p if p.suffix.lower() == ".json" else sidecar_path(p)
    return read_json_file(p, "sidecar")
