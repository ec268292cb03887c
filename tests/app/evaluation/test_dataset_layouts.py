"""Evaluation data as users have it: DATA/images + DATA/masks, Pascal VOC (its split, palette masks with 255
borders, classes mapped by name), and a folder in no known layout told which layouts were looked for."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gradscope.api import evaluate
from gradscope.app.evaluation.run import evaluation_settings, source_of
from gradscope.cli import main
from gradscope.core.errors import EXIT_USER_ERROR, GradscopeError
from gradscope.io.datasets import IGNORE, LAYOUTS, VOC_CLASSES, class_map_by_name, find_layout
from gradscope.io.synthetic import make_shapes_dataset
from tests.app.evaluation.test_evaluation import SIZE, TOL, engine, write_folder  # noqa: F401 (a fixture)

BACKGROUND = -1


@pytest.fixture(scope="module")
def shapes():
    images, labels, _, masks = make_shapes_dataset(8, 99, size=SIZE)
    return images, labels, np.where(masks, labels[:, None, None], BACKGROUND)


def test_images_and_masks_side_by_side_score_as_the_flat_folder(engine, shapes, tmp_path):  # noqa: F811
    flat = write_folder(tmp_path / "flat", *shapes[::2])
    side = tmp_path / "side"
    (side / "images").mkdir(parents=True)
    for p in flat.glob("*.png"):
        shutil.copy(p, side / "images" / p.name)
    shutil.copytree(flat / "masks", side / "masks")
    assert find_layout(side).name == "images+masks" and find_layout(flat).name == "flat"
    options = dict(methods=["gradient"], metrics=["pointing"], tolerance=TOL, batch=4)
    a = evaluate(engine, flat, out=tmp_path / "a", **options)
    b = evaluate(engine, side, out=tmp_path / "b", **options)
    assert a.images == b.images == 8 and not b.bad
    assert [r["value"] for r in a.table] == [r["value"] for r in b.table]


def _voc(root: Path, images: np.ndarray, class_masks: np.ndarray, values: list[int], split: list[int]) -> Path:
    """A VOCdevkit/VOC2012 tree: JPEGs, palette masks whose objects have a 255 border, a val split."""
    voc = root / "VOCdevkit" / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True)
    palette = [0, 0, 0] + [v for k in range(1, 256) for v in ((k * 37) % 256, (k * 91) % 256, (k * 53) % 256)]
    for i, (x, m) in enumerate(zip(images, class_masks)):
        stem = f"2007_{i:06d}"
        Image.fromarray((x * 255).round().astype(np.uint8)).save(voc / "JPEGImages" / f"{stem}.jpg", quality=95)
        mask = np.where(m >= 0, np.asarray(values)[np.clip(m, 0, None)], 0).astype(np.uint8)
        inside = m >= 0
        border = inside & ~(
            np.roll(inside, 1, 0) & np.roll(inside, -1, 0) & np.roll(inside, 1, 1) & np.roll(inside, -1, 1)
        )
        mask[border] = 255
        png = Image.fromarray(mask, mode="P")
        png.putpalette(palette)
        png.save(voc / "SegmentationClass" / f"{stem}.png")
    (voc / "ImageSets" / "Segmentation" / "val.txt").write_text("".join(f"2007_{i:06d}\n" for i in split))
    (voc / "ImageSets" / "Segmentation" / "train.txt").write_text("2007_000000\n")
    return root


def test_a_pascal_voc_folder_reads_its_split_and_maps_classes_by_name(engine, shapes, tmp_path):  # noqa: F811
    images, labels, masks = shapes
    names = ["cat", "dog", "Dining Table", "person"]  # the model's classes 0-3, as a description beside it says
    values = [VOC_CLASSES.index(n.replace(" ", "").lower()) + 1 for n in names]  # their VOC mask values
    root = _voc(tmp_path / "data", images, masks, values, split=[5, 1, 3, 6])
    layout = find_layout(root)
    assert layout.name == "voc" and layout.stems == ("2007_000005", "2007_000001", "2007_000003", "2007_000006")
    assert class_map_by_name(VOC_CLASSES, names) == dict(zip(values, range(4)))
    settings = evaluation_settings(["gradient"], ["pointing"], None, tolerance=TOL)
    source = source_of(engine, root, settings, class_names=names)
    assert source.keys() == [f"2007_00000{i}.jpg" for i in (5, 1, 3, 6)]  # the split, in its order
    sample = source.load("2007_000005.jpg")
    assert sample.classes() == [int(labels[5])]  # the name's class, not VOC's index - 1
    inside = masks[5] >= 0
    assert (sample.mask[inside] != BACKGROUND).all() and (sample.mask == IGNORE).any()  # the border is ignored
    assert set(np.unique(sample.mask[~inside])) <= {BACKGROUND, IGNORE}
    # through the CLI: the model's class names beside it map the classes; --split picks another list
    model = tmp_path / "model" / "shapes.keras"
    model.parent.mkdir()
    engine.model.save(model)
    model.with_suffix(".json").write_text('{"class_names": ["cat", "dog", "Dining Table", "person"]}')
    out = tmp_path / "out"
    argv = ["evaluate", str(model), str(root), "--out", str(out), "--metric", "pointing", "--tolerance", str(TOL)]
    assert main(argv) == 0
    report = evaluate(engine, root, out=out, metrics=["pointing"], tolerance=TOL, class_names=names)
    assert report.images == 4 and not report.bad  # (resumed: the same settings and data)
    assert main([*argv[:4], str(tmp_path / "train"), "--split", "train", *argv[5:]]) == 0
    with pytest.raises(GradscopeError, match="no split 'test'.*splits: train, val"):
        find_layout(root, "test")


def test_a_folder_in_no_known_layout_names_the_layouts_looked_for(engine, tmp_path, capsys):  # noqa: F811
    (tmp_path / "data" / "pictures").mkdir(parents=True)
    (tmp_path / "data" / "README.txt").write_text("my photos are in pictures/")
    with pytest.raises(GradscopeError) as err:
        find_layout(tmp_path / "data")
    assert all(layout in str(err.value) for layout in LAYOUTS)
    from gradscope.io.demo import demo_model_path

    argv = ["evaluate", str(demo_model_path()), str(tmp_path / "data"), "--out", str(tmp_path / "out")]
    assert main(argv) == EXIT_USER_ERROR
    assert "images/ and masks/ side by side" in capsys.readouterr().err
