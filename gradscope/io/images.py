"""Reading input images (Pillow) and turning them into a model's input batch."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import ImageLoadError
from gradscope.core.resources import bundled

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
PREPROCESSING = ("unit", "raw", "caffe", "minus_one_one")

# keras.applications "caffe" mode: BGR order, ImageNet channel means subtracted, no scaling.
_CAFFE_MEAN_BGR = np.array([103.939, 116.779, 123.68], dtype=np.float32)


MAX_PIXELS = 50_000_000  # larger images are refused before decoding (a 100 MP PNG needed 13 GB downstream)


def load_image(path: str | Path, size: int | tuple[int, int] | None = None, mode: str = "RGB") -> np.ndarray:
    """Read an image file as uint8: (H, W, 3) for ``mode="RGB"``, (H, W) for "L", (H, W, 4) for "RGBA".

    EXIF orientation is applied, the first frame of animated/multi-page files is used, and 16-bit or float
    images are scaled to 0..255. ``size`` resizes (bilinear) to ``(height, width)``, or a square if an int.
    Raises ``ImageLoadError`` if the file is missing, is not an image, or is damaged.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    p = Path(bundled(path)).expanduser()
    if p.is_symlink() and not p.exists():
        raise ImageLoadError(f"{p} is a symbolic link that leads nowhere (its target is missing, or a loop).")
    if not p.exists():
        raise ImageLoadError(f"Image file not found: {p}")
    if p.is_dir():
        raise ImageLoadError(f"{p} is a folder, not an image file.")
    if not p.is_file():  # a FIFO or a device would block the read forever
        raise ImageLoadError(f"{p} is not a regular file.")
    try:
        with open_image(p) as img:
            img.seek(0)
            img = ImageOps.exif_transpose(img)
            img = _to_mode(img, mode)
            if size is not None:
                h, w = _size(size)
                img = img.resize((w, h), Image.Resampling.BILINEAR)
            array = np.asarray(img, dtype=np.uint8)
    except UnidentifiedImageError as exc:
        raise ImageLoadError(
            f"{p} is not an image Pillow can read (supported: {', '.join(e[1:] for e in IMAGE_EXTENSIONS)})."
        ) from exc
    except ImageLoadError:
        raise
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow raises SyntaxError for some broken headers
        raise ImageLoadError(f"Image file {p} is damaged or truncated and cannot be read: {exc}") from exc
    return np.ascontiguousarray(array)


@contextmanager
def open_image(p: Path) -> Iterator[Any]:
    """``Image.open`` with gradscope's size limit checked from the header, before anything is decoded. Pillow's
    own decompression-bomb check (past ~179 MP it raises in ``open``) would otherwise answer first, and
    differently: it reads as the same refusal here."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(p)
    except Image.DecompressionBombError as exc:
        found = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{int(found.group(1)) / 1e6:.0f} MP" if found else "too large"
        raise ImageLoadError(
            f"{p.name} is {size} (by its header); gradscope reads images up to {MAX_PIXELS / 1e6:.0f} MP. "
            "Downscale it first."
        ) from None
    with img:
        w, h = img.size
        if w * h > MAX_PIXELS:
            raise ImageLoadError(
                f"{p.name} is {w}x{h} ({w * h / 1e6:.0f} MP); gradscope reads images up to "
                f"{MAX_PIXELS / 1e6:.0f} MP. Downscale it first."
            )
        yield img


def list_images(folder: str | Path) -> list[Path]:
    """The image files (png, jpg, jpeg, bmp, webp, tif) directly in ``folder``, sorted by name."""
    p = Path(folder).expanduser()
    if not p.exists():
        raise ImageLoadError(f"Image folder not found: {p}")
    if not p.is_dir():
        raise ImageLoadError(f"{p} is not a folder.")
    # a link to nothing (a loop, a moved target) is listed too: reading it then says so, where skipping it would not
    return sorted(
        (
            f
            for f in p.iterdir()
            if (f.is_file() or f.is_symlink() and not f.is_dir())
            and f.suffix.lower() in IMAGE_EXTENSIONS
            and not f.name.startswith(".")
        ),
        key=lambda f: f.name,
    )


def prepare_input(image: np.ndarray, input_shape: Sequence[int | None], preprocessing: str = "unit") -> np.ndarray:
    """A float32 batch ``(1, H, W, C)`` for a model whose input shape is ``(H, W, C)`` (batch dim optional).

    The image (uint8 (H, W), (H, W, 1), (H, W, 3) or (H, W, 4); float images in [0, 1] are accepted) is
    resized to the model's height and width with bilinear filtering (kept as is where they are ``None``),
    converted to the model's 1 or 3 channels, and scaled by ``preprocessing``:

    - ``"unit"``: x / 255, in [0, 1] (default)
    - ``"raw"``: x, in [0, 255]
    - ``"minus_one_one"``: x / 127.5 - 1, in [-1, 1]
    - ``"caffe"``: RGB -> BGR, ImageNet channel means subtracted (``keras.applications`` "caffe" mode)
    """
    from PIL import Image

    if preprocessing not in PREPROCESSING:
        raise ImageLoadError(f"Unknown preprocessing {preprocessing!r}; choose one of {', '.join(PREPROCESSING)}.")
    shape = tuple(input_shape)
    if len(shape) == 4:
        shape = shape[1:]
    if len(shape) != 3 or shape[-1] not in (1, 3):
        raise ImageLoadError(
            f"The model's input has shape {tuple(input_shape)}, which is not an image: gradscope needs an "
            "input of shape (height, width, channels) with 1 or 3 channels (channels last)."
        )
    height, width, channels = shape

    pixels = _as_uint8(image)
    img = Image.fromarray(pixels)
    img = img.convert("L") if channels == 1 else img.convert("RGB")
    target = (width or img.width, height or img.height)
    if target != img.size:
        img = img.resize(target, Image.Resampling.BILINEAR)
    x = np.asarray(img, dtype=np.float32)
    if channels == 1:
        x = x[..., None]

    if preprocessing == "unit":
        x = x / 255.0
    elif preprocessing == "minus_one_one":
        x = x / 127.5 - 1.0
    elif preprocessing == "caffe":
        x = x[..., ::-1] - _CAFFE_MEAN_BGR if channels == 3 else x - _CAFFE_MEAN_BGR.mean()
    return np.ascontiguousarray(x[None], dtype=np.float32)


# ------------------------------------------------------------------------------------------------- helpers
def _size(size: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(size, int):
        size = (size, size)
    h, w = (int(s) for s in size)
    if h <= 0 or w <= 0:
        raise ImageLoadError(f"Image size must be positive (height, width), got {size}.")
    return h, w


def _to_mode(img, mode: str):
    """Convert a Pillow image to ``mode``, scaling high bit-depth images (which ``convert`` would clip)."""
    from PIL import Image

    if mode not in ("RGB", "L", "RGBA"):
        raise ImageLoadError(f"Unsupported image mode {mode!r}; use 'RGB', 'L' or 'RGBA'.")
    if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        a = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or a.max() > 255 else 255.0
        if img.mode == "F" and a.max() <= 1.0:
            top = 1.0
        img = Image.fromarray(np.clip(a / top * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    elif img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert(mode)


def rgb_image(image: Any) -> np.ndarray:
    """An image given as an array (uint8 0-255, float 0-1 or 0-255, bool; gray, RGB or RGBA) as uint8 RGB
    (H, W, 3), or an ImageLoadError saying what is wrong (shape, emptiness, NaN, not numbers)."""
    a = _as_uint8(image)
    return np.repeat(a[..., None], 3, axis=-1) if a.ndim == 2 else a


def _as_uint8(image: Any) -> np.ndarray:
    try:
        a = np.asarray(image)
    except (TypeError, ValueError) as exc:
        raise ImageLoadError(f"Not an image array: {exc}") from None
    if not (a.dtype == bool or np.issubdtype(a.dtype, np.number)) or np.iscomplexobj(a):
        raise ImageLoadError(f"An image array holds numbers, not {a.dtype}.")
    if a.size == 0:
        raise ImageLoadError(f"The image array is empty (shape {a.shape}).")
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    elif a.ndim == 3 and a.shape[-1] == 4:
        a = a[..., :3]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] != 3):
        raise ImageLoadError(
            f"Expected an image array of shape (H, W), (H, W, 1), (H, W, 3) or (H, W, 4); got {a.shape}."
        )
    if a.dtype == np.uint8:
        return np.ascontiguousarray(a)
    if a.dtype == bool:
        return a.astype(np.uint8) * 255
    a = a.astype(np.float64)
    if not np.isfinite(a).all():
        raise ImageLoadError("The image array contains NaN or infinite values.")
    if a.max(initial=0.0) <= 1.0:
        a = a * 255.0
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)
