"""Blending a coloured saliency map over the input image, and the raw-signal -> picture pipeline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradscope.render.colormap import apply_colormap
from gradscope.render.normalize import gaussian_smooth, is_signed, normalize, resize_map, smoothing_sigma
from gradscope.render.reduce import reduce_channels

BLEND_STYLES: tuple[str, ...] = ("alpha", "caffe")


def as_rgb_float(image: np.ndarray) -> np.ndarray:
    """Any common image layout as float64 (H, W, 3) in [0, 255].

    uint8 is taken as is; float images with max <= 1 are scaled by 255 (others are taken as 0..255); grayscale
    (H, W) / (H, W, 1) is repeated to three channels; an alpha channel is dropped.
    """
    a = np.asarray(image)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim == 2:
        a = np.repeat(a[..., np.newaxis], 3, axis=-1)
    if a.ndim != 3 or a.shape[-1] not in (3, 4):
        raise ValueError(f"Expected an image (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got shape {a.shape}.")
    a = a[..., :3]
    if a.dtype == np.uint8:
        return a.astype(np.float64)
    f = np.nan_to_num(a.astype(np.float64), nan=0.0)
    if np.issubdtype(a.dtype, np.floating) and f.size and f.max() <= 1.0:
        f = f * 255.0
    return np.clip(f, 0.0, 255.0)


def _map_at(m: np.ndarray, shape: tuple[int, int], signed: bool) -> np.ndarray:
    a = np.nan_to_num(np.asarray(m, dtype=np.float32), nan=0.0)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim != 2:
        raise ValueError(f"Expected a 2-D map, got shape {a.shape}; reduce the channels first.")
    if a.shape != shape:
        a = resize_map(a, (shape[1], shape[0]), "bilinear")
    return np.clip(a, -1.0 if signed else 0.0, 1.0)


def blend(
    image: np.ndarray,
    map01: np.ndarray,
    cmap: str = "jet",
    alpha: float = 0.5,
    style: str = "alpha",
    signed: bool = False,
) -> np.ndarray:
    """The coloured map over the image, uint8 (H, W, 3); a map of another size is resized (bilinear).

    - ``alpha``: ``(1 - alpha) * img + alpha * cmap(m)`` everywhere.
    - ``caffe``: the Caffe excitation-backprop demo (RULES_SPEC §4 step 4), ``(1 - m^0.8) * img + m^0.8 *
      cmap(m)``: weak evidence lets the image show through. ``alpha`` is not used.

    ``map01`` is in [0, 1], or in [-1, 1] with ``signed=True`` (coloured around the LUT centre; the caffe
    weight is then ``|m|^0.8``).
    """
    if style not in BLEND_STYLES:
        raise ValueError(f"Unknown blend style {style!r}; use one of: {', '.join(BLEND_STYLES)}.")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
    img = as_rgb_float(image)
    m = _map_at(map01, img.shape[:2], signed)
    colored = apply_colormap(m, cmap, signed=signed).astype(np.float64)
    w = np.full(m.shape + (1,), float(alpha)) if style == "alpha" else (np.abs(m) ** 0.8)[..., np.newaxis]
    out = (1.0 - w) * img + w * colored
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class RenderedMap:
    """One rendering: the normalised map at image size, the map alone in colour, and the blend."""

    map01: np.ndarray  # float32 (H, W) in [0, 1] ([-1, 1] for a signed normalisation)
    colored: np.ndarray  # uint8 (H, W, 3)
    overlay: np.ndarray  # uint8 (H, W, 3)


def render_overlay(
    image: np.ndarray,
    saliency: np.ndarray,
    reduction: str = "max_abs",
    normalization: str = "minmax",
    cmap: str = "jet",
    alpha: float = 0.5,
    *,
    style: str = "alpha",
    resize: str = "bilinear",
    smooth: float = 0.0,
    percentile: float = 99.0,
) -> RenderedMap:
    """From a raw signal to the picture, in the Caffe demo's order: reduce, normalise, resize, blur, blend.

    ``saliency`` is (h, w, C) (reduced with ``reduction``) or an already reduced (h, w) map. ``smooth`` is
    the blur sigma as a fraction of max(H, W) (TorchRay's benchmark uses 0.02); after blurring the map is
    normalised again. ``normalization="signed"`` keeps the sign and colours it around the LUT centre.
    """
    s = np.asarray(saliency)
    if s.ndim == 3:
        s = reduce_channels(s, reduction)
    elif s.ndim != 2:
        raise ValueError(f"Expected a (h, w, C) signal or an (h, w) map, got shape {s.shape}.")
    img = as_rgb_float(image)
    h, w = img.shape[:2]
    signed = is_signed(normalization)
    m = normalize(s, normalization, percentile)
    m = np.clip(resize_map(m, (w, h), resize), -1.0 if signed else 0.0, 1.0)  # bicubic overshoots
    if smooth > 0:
        m = normalize(gaussian_smooth(m, smoothing_sigma((h, w), smooth)), normalization, percentile)
    m = m.astype(np.float32)
    colored = apply_colormap(m, cmap, signed=signed)
    overlay = blend(image, m, cmap=cmap, alpha=alpha, style=style, signed=signed)
    return RenderedMap(map01=m, colored=colored, overlay=overlay)
