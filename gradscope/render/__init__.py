"""Rendering of saliency maps, numpy/Pillow only: channel reduction, normalisation, colormaps, overlays, export.

Nothing here imports Qt or TensorFlow, so the CLI and the API can export pictures headless.
"""

from gradscope.render.colormap import DIVERGING, apply_colormap, available_colormaps, is_diverging, lut
from gradscope.render.export import load_sidecar, save_png, sidecar_path, sidecar_text
from gradscope.render.normalize import (
    NORMALIZATIONS,
    RESIZE_METHODS,
    gaussian_smooth,
    is_signed,
    normalize,
    resize_map,
    smoothing_sigma,
)
from gradscope.render.overlay import BLEND_STYLES, RenderedMap, as_rgb_float, blend, render_overlay
from gradscope.render.quality import degeneracy
from gradscope.render.reduce import DEFAULT_REDUCTION_FOR_METHOD, REDUCTIONS, reduce_channels, token_grid

__all__ = [
    "BLEND_STYLES",
    "DEFAULT_REDUCTION_FOR_METHOD",
    "DIVERGING",
    "NORMALIZATIONS",
    "REDUCTIONS",
    "RESIZE_METHODS",
    "RenderedMap",
    "apply_colormap",
    "as_rgb_float",
    "available_colormaps",
    "blend",
    "degeneracy",
    "gaussian_smooth",
    "is_diverging",
    "is_signed",
    "load_sidecar",
    "lut",
    "normalize",
    "reduce_channels",
    "token_grid",
    "render_overlay",
    "resize_map",
    "save_png",
    "sidecar_path",
    "sidecar_text",
    "smoothing_sigma",
]
