"""How a backward signal becomes the picture on screen and in every export: the view settings and the one
rendering pipeline (channel reduction, normalisation, resize to the image, colormap, blend).

The GUI's overlay view, ``Session.export_overlay``, ``gradscope explain`` and ``Explanation.save`` all call
``overlay_images`` with a ``ViewSettings``, so one result with one view gives the same pixels everywhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradscope import render
from gradscope.core.errors import GradscopeError
from gradscope.core.formats import ViewFile, decode
from gradscope.render import token_grid

INPUT_KEY = "<input>"  # flow-table / stats key of the model input (it is not an engine node)
NORMALIZATIONS = tuple(n for n in render.NORMALIZATIONS if n != "abs_max")  # abs_max: an alias of abs
#: A signed method's map: diverging, clipped at the 99th percentile of |m| (LRP-ε's mass sat in a few pixels and
#: its overlay was the image with one red fleck, like the gradient's; issue 51).
SIGNED_DEFAULT = "signed_percentile"
REDUCTIONS = render.REDUCTIONS
PREPROCESSINGS = ("unit", "raw", "caffe", "minus_one_one")


class ViewError(GradscopeError):
    """A view setting no picture can be drawn with (an unknown colormap, alpha outside [0, 1], ...)."""


@dataclass
class ViewSettings:
    """How the map is read out and drawn (the overlay view's controls, the sidecar's ``view``)."""

    colormap: str = "jet"
    alpha: float = 0.5
    normalization: str = "minmax"
    reduction: str = "max_abs"
    readout_node: str | None = INPUT_KEY  # INPUT_KEY: the model input; None: follow the selected node
    times_input: bool = False
    signed: bool = False
    grad_cam: bool = False  # weight the node's value by its channel-mean gradient (Grad-CAM) before reducing
    style: str = "caffe"  # blend: "caffe" (the map's strength is its opacity, RULES_SPEC §4) or "alpha"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def check(self) -> None:
        """Raise ``ViewError`` (a user error, one line) for a value no picture can be drawn with."""
        problems = []
        if not isinstance(self.colormap, str) or self.colormap.lower() not in render.available_colormaps():
            problems.append(f"colormap {self.colormap!r} (choose: {', '.join(render.available_colormaps())})")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0.0 <= self.alpha <= 1.0:
            problems.append(f"alpha {self.alpha!r} (a number from 0 to 1)")
        if self.normalization not in render.NORMALIZATIONS:
            problems.append(f"normalization {self.normalization!r} (choose: {', '.join(NORMALIZATIONS)})")
        if self.reduction not in render.REDUCTIONS:
            problems.append(f"reduction {self.reduction!r} (choose: {', '.join(render.REDUCTIONS)})")
        if self.style not in render.BLEND_STYLES:
            problems.append(f"blend style {self.style!r} (choose: {', '.join(render.BLEND_STYLES)})")
        if problems:
            raise ViewError("Cannot draw the map with " + "; ".join(problems) + ".")

    @classmethod
    def from_dict(cls, data: Any, *, what: str = "The view settings") -> ViewSettings:
        """View settings from parsed JSON, checked against ``core.formats.ViewFile`` (unknown keys are errors:
        they used to be dropped silently)."""
        doc = decode(data or {}, ViewFile, what=what, error=ViewError, parsed=True)
        return cls(**{f: getattr(doc, f) for f in doc.__struct_fields__})

    @classmethod
    def for_method(cls, method: Any, **overrides: Any) -> ViewSettings:
        """A method preset's read-out defaults (signed methods get a diverging map), then ``overrides``."""
        view = cls(
            reduction=method.reduction,
            times_input=method.times_input,
            signed=method.signed,
            grad_cam=method.grad_cam,
            readout_node=method.readout_node or INPUT_KEY,
        )
        if method.signed:
            view = dataclasses.replace(view, colormap="bwr", normalization=SIGNED_DEFAULT)
        return dataclasses.replace(view, **{k: v for k, v in overrides.items() if v is not None})


@dataclass
class OverlayImages:
    """What the overlay view shows, all uint8 RGB (H, W, 3) except ``saliency`` (float, not normalised)."""

    image: np.ndarray | None
    heat: np.ndarray
    blend: np.ndarray | None
    saliency: np.ndarray
    node: str | None
    spatial: bool
    note: str = ""
    labels: tuple[str, ...] = ()  # a per-position map (tokens, features): what each score is

    @property
    def picture(self) -> np.ndarray:
        """What an export writes: the blend over the image, or the heat map where there is no blend."""
        return self.blend if self.blend is not None else self.heat


def to_map(signal: np.ndarray, reduction: str) -> tuple[np.ndarray, bool]:
    """A 2-D map from one sample's signal: (H, W, C) reduced over channels; (L, C) and (N,) become a strip."""
    s = np.asarray(signal, dtype=np.float32)
    if s.ndim == 3:
        return render.reduce_channels(s, reduction), True
    if s.ndim == 2:
        return render.reduce_channels(s, reduction)[None, :], False
    if s.ndim == 4:  # (D, H, W, C): reduce channels, then the strongest slice
        return np.max(np.abs(render.reduce_channels(s, reduction)), axis=0), True
    return s.reshape(1, -1), False


def overlay_images(
    signal: np.ndarray, image: np.ndarray | None, view: ViewSettings, node: str | None = None, *, blend: bool = True
) -> OverlayImages:
    """The picture of one sample's ``signal`` (already multiplied by the input if the view says so).
    ``blend=False``: the image does not fit the model input (e.g. a random input), so only the heat map."""
    view.check()
    grid = token_grid(signal) if image is not None and blend else None  # a ViT's tokens: a map per patch
    saliency, spatial = to_map(signal if grid is None else grid, view.reduction)
    signed = render.is_signed(view.normalization)
    m = render.normalize(saliency, view.normalization)
    note = ""
    overlay = None
    if spatial and image is not None and blend:
        h, w = image.shape[:2]
        m_big = np.clip(render.resize_map(m, (w, h)), -1.0 if signed else 0.0, 1.0)
        heat = render.apply_colormap(m_big, view.colormap, signed=signed)
        overlay = render.blend(image, m_big, cmap=view.colormap, alpha=view.alpha, style=view.style, signed=signed)
    else:
        heat = render.apply_colormap(m, view.colormap, signed=signed)
        if not spatial:
            note = "This node's output is not spatial: its signal is shown as a strip."
    return OverlayImages(
        image, as_rgb_uint8(heat), None if overlay is None else as_rgb_uint8(overlay), saliency, node, spatial, note
    )


def degenerate_note(saliency: np.ndarray, method: str = "") -> str:
    """A sentence when the map carries no information, with the likely cause; empty when it is fine."""
    why = render.degeneracy(saliency)
    if why is None:
        return ""
    cause = ""
    if why == "all zero" and any(k in method for k in ("lrp", "mwp")):
        cause = (
            " Likely: the stabiliser underflowed, or (c-MWP) the contrast is negative everywhere, which is"
            " common on untrained networks and untrained BatchNorm."
        )
    elif why.startswith("non-finite"):
        cause = " Likely: NaN/Inf in the model's weights or outputs, or a rule that divides by zero."
    return f"The map is {why}: it shows nothing.{cause}"


def concentration_note(saliency: np.ndarray, normalization: str) -> str:
    """A sentence when half of a spatial map's mass (sum of |m|) sits in under 1 % of its pixels: drawn scaled to
    its largest value it is one fleck on the image (LRP-ε on the demo), so say so, and what shows the rest."""
    a = np.abs(np.asarray(saliency, np.float64))
    a = a[np.isfinite(a)]
    if a.ndim != 1 or a.size < 400 or a.sum() <= 0:
        return ""
    ordered = np.sort(a)[::-1]
    holding = int(np.searchsorted(np.cumsum(ordered), 0.5 * ordered.sum())) + 1  # pixels holding half the mass
    if holding >= 0.01 * a.size:
        return ""
    share = f"Half of the map's mass sits in {holding} of its {a.size} values ({100 * holding / a.size:.2g} %)"
    if normalization in ("percentile", "signed_percentile"):
        return f"{share}: the colours are clipped at the 99th percentile so the rest shows."
    return f"{share}: drawn to its largest value the rest is faint; Norm 'signed_percentile' or 'percentile' shows it."


def as_rgb_uint8(image: np.ndarray) -> np.ndarray:
    """uint8 (H, W, 3) from a uint8 or [0, 1] float image, grey or RGB(A)."""
    a = np.asarray(image)
    if a.dtype != np.uint8:
        a = np.clip(a * (255.0 if a.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=-1)
    return np.ascontiguousarray(a[..., :3])


def colormaps() -> tuple[str, ...]:
    return tuple(render.available_colormaps())
