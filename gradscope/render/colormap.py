"""Colormap lookup tables (uint8, n x 3) and their application to normalised maps.

jet, gray, hot, bwr and coolwarm are defined here in numpy, so exporting never depends on a GUI library.
The perceptual maps (viridis, inferno, magma, plasma, cividis, turbo) are read from the CSV tables that ship
inside pyqtgraph. Those files are parsed directly, never through ``pyqtgraph.colormap`` (importing it imports
Qt), so an export gives the same pixels whether or not the GUI is running.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

DIVERGING: frozenset[str] = frozenset({"bwr", "coolwarm"})
_NUMPY_MAPS = ("jet", "gray", "hot", "bwr", "coolwarm")
_PYQTGRAPH_MAPS = ("viridis", "inferno", "magma", "plasma", "cividis", "turbo")

# matplotlib's "coolwarm" (Moreland 2009) sampled at 33 points; linear interpolation stays within 4 of 255
# levels of the original, without needing matplotlib at run time.
_COOLWARM_ANCHORS = (
    (59, 76, 192), (68, 90, 204), (78, 104, 216), (88, 117, 225), (98, 130, 234), (108, 143, 241),
    (119, 154, 247), (130, 166, 251), (141, 176, 254), (152, 185, 255), (163, 194, 254), (174, 201, 252),
    (185, 208, 249), (195, 213, 244), (204, 217, 237), (213, 219, 229), (221, 220, 220), (229, 216, 209),
    (236, 211, 197), (241, 204, 184), (245, 196, 172), (247, 186, 159), (247, 176, 147), (246, 165, 134),
    (244, 152, 122), (240, 139, 110), (235, 125, 98), (228, 110, 86), (221, 95, 75), (212, 78, 65),
    (202, 59, 55), (190, 36, 46), (180, 4, 38),
)  # fmt: skip


def _jet(t: np.ndarray) -> np.ndarray:
    """Classic MATLAB jet: piecewise-linear dark blue -> blue -> cyan -> yellow -> red -> dark red."""
    return np.stack([np.clip(1.5 - np.abs(4.0 * t - c), 0.0, 1.0) for c in (3.0, 2.0, 1.0)], axis=-1)


def _hot(t: np.ndarray) -> np.ndarray:
    return np.stack([np.clip(3 * t, 0, 1), np.clip(3 * t - 1, 0, 1), np.clip(3 * t - 2, 0, 1)], axis=-1)


def _bwr(t: np.ndarray) -> np.ndarray:
    """Blue (0) -> white (0.5) -> red (1), as matplotlib's bwr."""
    return np.stack([np.clip(2 * t, 0, 1), 1.0 - np.abs(2 * t - 1), np.clip(2 - 2 * t, 0, 1)], axis=-1)


def _interp_anchors(t: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    x = np.linspace(0.0, 1.0, len(anchors))
    return np.stack([np.interp(t, x, anchors[:, c]) for c in range(3)], axis=-1)


def _numpy_lut(name: str, t: np.ndarray) -> np.ndarray:
    if name == "jet":
        return _jet(t)
    if name == "gray":
        return np.stack([t, t, t], axis=-1)
    if name == "hot":
        return _hot(t)
    if name == "bwr":
        return _bwr(t)
    return _interp_anchors(t, np.asarray(_COOLWARM_ANCHORS, dtype=np.float64) / 255.0)


def _pyqtgraph_maps_dir() -> Path | None:
    """pyqtgraph's bundled map folder, located without importing pyqtgraph (which would import Qt)."""
    try:
        spec = importlib.util.find_spec("pyqtgraph")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "colors" / "maps"
    return folder if folder.is_dir() else None


def _read_csv_map(path: Path) -> np.ndarray:
    """Rows ``r,g,b[;comment]`` in [0, 1]; lines starting with ';' are comments (pyqtgraph's format)."""
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        parts = line.split(";", 1)[0].split(",")
        if len(parts) >= 3:
            rows.append([float(c) for c in parts[:3]])
    if len(rows) < 2:
        raise ValueError(f"{path} holds fewer than two colours.")
    return np.asarray(rows, dtype=np.float64)


def _pyqtgraph_lut(name: str, t: np.ndarray) -> np.ndarray | None:
    folder = _pyqtgraph_maps_dir()
    if folder is not None and (folder / f"{name}.csv").is_file():
        try:
            return _interp_anchors(t, _read_csv_map(folder / f"{name}.csv"))
        except (OSError, ValueError):
            return None
    return None


def available_colormaps() -> list[str]:
    """Names ``lut`` accepts here: the numpy maps always, the perceptual ones when pyqtgraph is installed."""
    folder = _pyqtgraph_maps_dir()
    extra = [n for n in _PYQTGRAPH_MAPS if folder is not None and (folder / f"{n}.csv").is_file()]
    return list(_NUMPY_MAPS) + extra


def is_diverging(name: str) -> bool:
    """Whether ``name`` is meant for signed maps (centre = zero)."""
    return name.lower() in DIVERGING


@lru_cache(maxsize=64)
def _cached_lut(name: str, n: int) -> np.ndarray:
    t = np.linspace(0.0, 1.0, n)
    if name in _NUMPY_MAPS:
        rgb = _numpy_lut(name, t)
    elif name in _PYQTGRAPH_MAPS:
        rgb = _pyqtgraph_lut(name, t)
        if rgb is None:
            raise ValueError(f"Colormap {name!r} needs pyqtgraph's colormap data, which is not installed.")
    else:
        raise ValueError(f"Unknown colormap {name!r}; use one of: {', '.join(available_colormaps())}.")
    lut_ = np.clip(np.rint(rgb * 255.0), 0, 255).astype(np.uint8)
    lut_.setflags(write=False)
    return lut_


def lut(name: str, n: int = 256) -> np.ndarray:
    """The (n, 3) uint8 lookup table of colormap ``name`` (case-insensitive); index 0 is the low end."""
    if int(n) < 2:
        raise ValueError(f"A lookup table needs at least 2 entries, got n={n}.")
    return _cached_lut(name.lower(), int(n)).copy()


def apply_colormap(m: np.ndarray, name: str = "jet", signed: bool = False, n: int = 256) -> np.ndarray:
    """Colour a map: (...) float -> (..., 3) uint8.

    ``m`` is expected in [0, 1], or in [-1, 1] with ``signed=True`` (then 0 lands on the LUT's centre, which
    is white for the diverging maps). Out-of-range values are clipped; NaN is drawn as 0.
    """
    table = _cached_lut(name.lower(), int(n))
    t = np.nan_to_num(np.asarray(m, dtype=np.float64), nan=0.0)
    if signed:
        t = (t + 1.0) * 0.5
    idx = np.rint(np.clip(t, 0.0, 1.0) * (len(table) - 1)).astype(np.intp)
    return table[idx]


def hex_colour(rgb: Sequence[float]) -> str:
    """``#rrggbb`` of an RGB colour (0-255): the HTML and SVG displays colour with it."""
    return "#{:02x}{:02x}{:02x}".format(*(int(c) for c in rgb[:3]))
