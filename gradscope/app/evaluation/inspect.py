"""One evaluated image looked at: each method's map of it for one class, with the Pointing Game's point and
whether it hit the class's mask: the same maps, points and tolerance the evaluation scored (``scoring``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.app.evaluation.scoring import EvalSettings, eval_methods, image_rng
from gradscope.engine.evaluation import faithfulness as fm
from gradscope.engine.evaluation.maps import method_maps
from gradscope.render import apply_colormap
from gradscope.render.normalize import normalize, resize_map


@dataclass
class MethodView:
    method: str
    saliency: np.ndarray  # (H, W) at the image's size, as the Pointing Game reads it (before any blur)
    heat: np.ndarray  # uint8 (H, W, 3): the map in colour, min-max
    point: tuple[int, int] | None  # (row, col) the Pointing Game takes; None for the random baseline (expected)
    hit: bool | None  # the point within the tolerance of the class's mask (None: no mask or no point)


@dataclass
class ImageInspection:
    key: str
    image: np.ndarray  # uint8 (H, W, 3)
    mask: np.ndarray | None  # (H, W) class index, BACKGROUND or IGNORE
    cls: int  # the class the maps explain: the first the mask shows, else the model's top-1
    views: list[MethodView]
    path: Path | None  # the image file (to open it in the main view)


def inspect_image(
    engine: Any, source: Any, settings: EvalSettings, key: str, cls: int | None = None
) -> ImageInspection:
    """Every method of ``settings`` on the image ``key`` of ``source`` for ``cls`` (default: the first class its
    mask shows, else the top-1). Runs the model: call it on the worker."""
    sample = source.load(key)
    x = sample.x[None]
    if cls is None:
        shown = sample.classes()
        cls = shown[0] if shown else int(np.argmax(engine.logits(x)[0]))
    path = _image_path(source, key)
    image = _display_image(path, sample.x)
    size = image.shape[:2]
    mask = sample.mask if sample.mask is not None and sample.mask.shape == size else None
    views = []
    for m in eval_methods(engine, settings):
        if m.baseline == "random":
            saliency = image_rng(settings.seed, key).uniform(size=size).astype(np.float32)
        elif m.baseline == "center":
            yy, xx = np.mgrid[0 : size[0], 0 : size[1]]
            saliency = -((yy - (size[0] - 1) / 2) ** 2 + (xx - (size[1] - 1) / 2) ** 2).astype(np.float32)
        else:
            raw = method_maps(engine, m.method, x, np.array([cls], np.int32), settings.batch)[0]
            saliency = resize_map(np.asarray(raw, np.float32), (size[1], size[0]), "bilinear")
        point = None
        if m.baseline == "center":
            point = (size[0] // 2, size[1] // 2)
        elif m.baseline is None:
            point = fm.pointing_point(saliency, size, m.smoothed)
        hit = None if point is None or mask is None else fm.pointing_hit(point, mask == cls, settings.tolerance)
        views.append(MethodView(m.label, saliency, _heat(saliency), point, hit))
    return ImageInspection(key, image, mask, int(cls), views, path)


def _heat(saliency: np.ndarray) -> np.ndarray:
    return np.asarray(apply_colormap(normalize(saliency, "minmax"), "jet"))[..., :3].astype(np.uint8)


def _image_path(source: Any, key: str) -> Path | None:
    layout = getattr(source, "layout", None)
    return None if layout is None else layout.images / key


def _display_image(path: Path | None, x: np.ndarray) -> np.ndarray:
    """The image file as it is (the model's input is scaled for the model), else the input stretched to 0-255."""
    if path is not None:
        from gradscope.io.images import load_image

        return load_image(path)
    x = np.asarray(x, np.float32)
    x = (x - x.min()) / (np.ptp(x) or 1.0)
    return ((np.repeat(x, 3, -1) if x.shape[-1] == 1 else x[..., :3]) * 255).astype(np.uint8)
