"""Evaluation data: a folder of images with VOC-style class masks, or arrays already in the model's input space.

A folder is in one of three layouts (``find_layout``): the images themselves with ``masks/`` beside them;
``images/`` and ``masks/`` side by side (the usual segmentation layout); or Pascal VOC (``JPEGImages/``,
``SegmentationClass/``, the split in ``ImageSets/Segmentation/<split>.txt``; the folder may be ``VOC2012``,
``VOCdevkit`` or the folder above it). A mask is ``<image stem>.png``: an indexed (or grayscale) PNG of the
image's size whose pixel value is the class index + 1, 0 the background and 255 "ignore" (the VOC convention); a
class map (``{mask value: model class}``, or ``class_map_by_name``) replaces the +1 rule. Every problem with one
image (it does not decode, its mask is missing, unreadable, of another size or holds a value outside the class
map) is a ``DataProblem`` naming it: the evaluation lists it and goes on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gradscope.core.errors import GradscopeError, ImageLoadError
from gradscope.core.files import shorten
from gradscope.core.json_text import read_json_file
from gradscope.core.resources import bundled
from gradscope.io.images import list_images, load_image, open_image, prepare_input

BACKGROUND, IGNORE = -1, -2  # what mask pixels that name no class hold in ``Sample.mask``
MASK_FOLDER = "masks"
VOC_CLASSES = (  # mask value k + 1 (0 is the background, 255 the objects' borders: ignored)
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable", "dog",
    "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)  # fmt: skip
LAYOUTS = (
    "images with masks/ beside them (DATA/*.png + DATA/masks/*.png)",
    "images/ and masks/ side by side (DATA/images/ + DATA/masks/)",
    "Pascal VOC (JPEGImages/, SegmentationClass/, ImageSets/Segmentation/<split>.txt)",
)


@dataclass(frozen=True)
class Layout:
    """Where a dataset folder keeps its images and masks, and which images it names (a VOC split)."""

    name: str  # "flat", "images+masks" or "voc"
    images: Path
    masks: Path
    stems: tuple[str, ...] | None = None  # the split's image stems, in its order (None: every image)
    split: str | None = None


def find_layout(root: str | Path, split: str = "val") -> Layout:
    """The layout of the dataset folder ``root``; a ``GradscopeError`` naming the layouts looked for if none."""
    root = Path(bundled(root)).expanduser()
    if not root.is_dir():
        raise GradscopeError(f"The dataset folder {root} does not exist.")
    voc = _voc_root(root)
    if voc is not None:
        return _voc_layout(voc, split)
    if (root / "images").is_dir() and list_images(root / "images"):
        return Layout("images+masks", root / "images", root / MASK_FOLDER)
    if list_images(root):
        return Layout("flat", root, root / MASK_FOLDER)
    looked = "; ".join(LAYOUTS)
    raise GradscopeError(f"{root} holds no images in a layout gradscope reads. It looked for: {looked}.")


def _voc_root(root: Path) -> Path | None:
    candidates = [root, *sorted(root.glob("VOC20*")), *sorted(root.glob("VOCdevkit/VOC20*"))]
    return next((c for c in candidates if (c / "JPEGImages").is_dir() and (c / "SegmentationClass").is_dir()), None)


def _voc_layout(root: Path, split: str) -> Layout:
    sets = root / "ImageSets" / "Segmentation"
    path = sets / f"{split}.txt"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in sets.glob("*.txt"))) or "none"
        raise GradscopeError(f"Pascal VOC folder {root}: no split {split!r} ({path} is missing; splits: {have}).")
    try:
        # utf-8-sig: a byte-order mark would glue itself to the first stem; a stem listed twice is scored once
        listed = [line.split()[0] for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
        stems = tuple(dict.fromkeys(listed))
    except (OSError, UnicodeDecodeError) as exc:
        raise GradscopeError(f"Cannot read the VOC split {path}: {exc}.") from exc
    return Layout("voc", root / "JPEGImages", root / "SegmentationClass", stems, split)


def class_map_by_name(dataset_classes: Sequence[str], model_classes: Sequence[str]) -> dict[int, int]:
    """``{mask value: model class}`` for the dataset's classes (mask value k + 1 is ``dataset_classes[k]``) whose
    name the model has ("dining table", "DiningTable" and "diningtable" are one name); a ``GradscopeError`` when
    none match."""

    def key(name: str) -> str:
        return "".join(ch for ch in name.lower() if ch.isalnum())

    index = {key(n): i for i, n in enumerate(model_classes)}
    out = {k + 1: index[key(n)] for k, n in enumerate(dataset_classes) if key(n) in index}
    if not out:
        raise GradscopeError(
            f"None of the dataset's classes ({', '.join(dataset_classes[:5])}, ...) is a class name of the model; "
            "give a class map (--class-map) instead."
        )
    return out


class DataProblem(GradscopeError):
    """One image of a dataset cannot be evaluated; the message says why (the run lists it and goes on)."""


@dataclass
class Sample:
    key: str  # the image's file name (or its name in an array dataset)
    x: np.ndarray  # (H, W, C) float32: the model's input
    mask: np.ndarray | None = None  # (h, w) int32 at the image's own size: class index, BACKGROUND or IGNORE
    difficult: frozenset[int] | None = None  # the classes a difficult-pairs file flags here (None: not listed)
    _classes: list[int] | None = field(default=None, init=False, repr=False, compare=False)  # classes(), once

    def classes(self) -> list[int]:
        """The classes the mask shows (for the Pointing Game: one map per image and class), ascending."""
        if self.mask is None:
            return []
        if self._classes is None:
            counts = np.bincount(self.mask.ravel() - IGNORE)  # IGNORE -> 0, BACKGROUND -> 1, class c -> c + 2
            self._classes = [int(c) for c in np.flatnonzero(counts[2:])]
        return self._classes


def load_class_map(path: str | Path) -> dict[int, int]:
    """``{mask value: model class index}`` from a JSON object (``{"1": 0, "15": 14}``)."""
    p = Path(path).expanduser()
    doc = read_json_file(p, "class map", unique_keys=True)  # "1" twice: which class did the user mean?
    if not isinstance(doc, dict) or not doc:
        raise GradscopeError(f"The class map {p} must be a JSON object {{mask value: class index}}.")
    out: dict[int, int] = {}
    for k, v in doc.items():
        try:
            value, cls = int(k), v
        except ValueError:
            raise GradscopeError(f"Class map {p}: key {shorten(k)!r} is not a mask value (0-255).") from None
        if value in out:  # "1" and "01"
            raise GradscopeError(f"Class map {p}: mask value {value} is given twice.")
        if not 0 < value < 255 or isinstance(cls, bool) or not isinstance(cls, int) or cls < 0:
            raise GradscopeError(
                f"Class map {p}: {k!r}: {v!r} must map a mask value 1-254 to a class index >= 0 "
                "(0 is the background, 255 'ignore')."
            )
        out[value] = cls
    return out


def load_difficult_flags(path: str | Path) -> dict[str, list[bool]]:
    """TorchRay's difficult-pairs file (``pointing_game_ebp_voc07_difficult.txt``): per line an image stem, then a
    0/1 flag per dataset class (the class of mask value k + 1 in column k)."""
    p = Path(path).expanduser()
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise GradscopeError(f"Cannot read the difficult-pairs file {p}: {exc.strerror or exc}.") from exc
    flags: dict[str, list[bool]] = {}
    for n, line in enumerate(lines, 1):
        cells = line.split()
        if not cells:
            continue
        if any(c not in ("0", "1") for c in cells[1:]) or len(cells) < 2:
            raise GradscopeError(f"{p}, line {n}: expected an image name and 0/1 flags, got {line[:80]!r}.")
        flags[cells[0]] = [c == "1" for c in cells[1:]]
    return flags


def classes_of_mask(values: np.ndarray, class_map: dict[int, int] | None, classes: int | None) -> np.ndarray:
    """A mask's pixel values as class indices (BACKGROUND for 0, IGNORE for 255); a ``DataProblem`` for a value
    outside the class map or a class the model does not have."""
    out = np.full(values.shape, BACKGROUND, np.int32)
    out[values == 255] = IGNORE
    for v in np.unique(values):
        v = int(v)
        if v in (0, 255):
            continue
        if class_map is not None:
            if v not in class_map:
                raise DataProblem(f"mask value {v} is not in the class map")
            cls = class_map[v]
        else:
            cls = v - 1
        if classes is not None and cls >= classes:
            raise DataProblem(f"mask value {v} names class {cls}; the model has {classes} classes")
        out[values == v] = cls
    return out


def read_mask(path: Path, size: tuple[int, int]) -> np.ndarray:
    """A mask PNG's pixel values (h, w); ``size`` = the image's (h, w), which it must have."""
    from PIL import UnidentifiedImageError

    if not path.is_file():
        raise DataProblem(f"no mask ({path.parent.name}/{path.name} is missing)")
    try:
        with open_image(path) as img:
            if img.mode not in ("P", "L", "I", "I;16"):
                raise DataProblem(f"mask {path.name} is a {img.mode} image; it must be indexed or grayscale")
            values = np.asarray(img)
    except ImageLoadError as exc:
        raise DataProblem(f"mask {exc}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DataProblem(f"mask {path.name} cannot be read ({type(exc).__name__}: {exc})") from exc
    if values.shape != tuple(size):
        raise DataProblem(f"mask {path.name} is {values.shape[1]}x{values.shape[0]}, the image {size[1]}x{size[0]}")
    return values


@dataclass
class ImageFolder:
    """The images of the dataset folder ``root`` (in the order of its split, else by name) with their masks when
    ``with_masks``, wherever its layout (``find_layout``) keeps them."""

    root: Path
    input_shape: tuple
    preprocessing: str = "unit"
    with_masks: bool = True
    class_map: dict[int, int] | None = None
    classes: int | None = None  # the model's class count (a mask naming another class is a problem)
    difficult_flags: dict[str, list[bool]] | None = None  # ``load_difficult_flags``: pairs flagged per image
    split: str = "val"  # a Pascal VOC folder's split

    def __post_init__(self) -> None:
        self.layout = find_layout(self.root, self.split)

    def keys(self) -> list[str]:
        images = list_images(self.layout.images)
        if self.layout.stems is None:
            return [p.name for p in images]
        by_stem = {p.stem: p.name for p in images}
        return [by_stem.get(s, s) for s in self.layout.stems]  # a listed image that is missing: load() says so

    def load(self, key: str) -> Sample:
        if key in ("", ".", "..") or Path(key).name != key or "\0" in key:  # a split's line is data: never a path
            raise DataProblem(f"the split {self.layout.split}.txt lists it, but it is not an image name")
        path = self.layout.images / key
        if self.layout.stems is not None and not (path.exists() or path.is_symlink()):
            raise DataProblem(
                f"the split {self.layout.split}.txt lists it, but {self.layout.images.name}/ has no image {key}.*"
            )
        try:
            image = load_image(path)
            x = prepare_input(image, self.input_shape, self.preprocessing)[0]
        except ImageLoadError as exc:
            raise DataProblem(f"image does not decode: {exc}") from exc
        mask = None
        if self.with_masks:
            values = read_mask(self.layout.masks / f"{Path(key).stem}.png", image.shape[:2])
            mask = classes_of_mask(values, self.class_map, self.classes)
        return Sample(key, x, mask, self._difficult(Path(key).stem))

    def _difficult(self, stem: str) -> frozenset[int] | None:
        """The model classes flagged difficult for this image (column k is mask value k + 1, then the map)."""
        flags = None if self.difficult_flags is None else self.difficult_flags.get(stem)
        if flags is None:
            return None
        values = [k + 1 for k, flagged in enumerate(flags) if flagged]
        return frozenset(self.class_map.get(v, -1) if self.class_map else v - 1 for v in values)

    def describe(self) -> dict:
        return {
            "folder": str(self.root),
            **({"layout": self.layout.name} if self.layout.name != "flat" else {}),  # (flat: as before, resumable)
            **({"split": self.layout.split} if self.layout.split else {}),
            "preprocessing": self.preprocessing,
            "class_map": {str(k): v for k, v in (self.class_map or {}).items()} or None,
            "difficult_flags": None if self.difficult_flags is None else _digest(self.difficult_flags),
        }


@dataclass
class ArraySamples:
    """Inputs already in the model's input space (n, H, W, C), with class masks (n, H, W) of class indices and
    BACKGROUND / IGNORE, or None; ``names`` default to ``"0"``, ``"1"``, ..."""

    inputs: np.ndarray
    masks: np.ndarray | None = None
    names: Sequence[str] | None = None
    _index: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)  # name -> row

    def keys(self) -> list[str]:
        return list(self.names) if self.names is not None else [str(i) for i in range(len(self.inputs))]

    def load(self, key: str) -> Sample:
        if self.names is None:
            i = int(key)
        else:
            if self._index is None:
                self._index = {name: i for i, name in enumerate(self.names)}
            i = self._index[key]
        mask = None if self.masks is None else np.asarray(self.masks[i], np.int32)
        return Sample(key, np.asarray(self.inputs[i], np.float32), mask)

    def describe(self) -> dict:
        return {"arrays": list(np.shape(self.inputs))}


def _digest(doc: object) -> str:
    """A short fingerprint of a JSON-able object (settings compare it: the same file, the same run)."""
    import hashlib

    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()[:16]
