"""PNG + sidecar export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gradscope.render import export as render_export
from gradscope.render import load_sidecar, save_png, sidecar_path


@pytest.fixture
def picture() -> np.ndarray:
    return np.random.default_rng(8).integers(0, 256, size=(9, 13, 3), dtype=np.uint8)


def test_png_round_trip(tmp_path: Path, picture: np.ndarray) -> None:
    out = save_png(tmp_path / "overlay.png", picture)
    assert out == tmp_path / "overlay.png"
    with Image.open(out) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(im), picture)
    assert not sidecar_path(out).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["overlay.png"]  # no temp files left


def test_grayscale_png(tmp_path: Path) -> None:
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    with Image.open(save_png(tmp_path / "g.png", gray)) as im:
        assert im.mode == "L"
        np.testing.assert_array_equal(np.asarray(im), gray)


def test_sidecar_keys_and_numpy_values(tmp_path: Path, picture: np.ndarray) -> None:
    meta = {
        "method": "cmwp",
        "target": {"index": np.int64(281)},
        "alpha": np.float32(0.5),
        "shape": np.array([9, 13]),
        "path": tmp_path / "in.png",
        "nan_stat": float("nan"),
        "changed": ("a", "b"),
    }
    png = save_png(tmp_path / "sub" / "x.png", picture, meta)
    assert png.parent.name == "sub"  # missing folder created
    side = load_sidecar(png)
    assert side == load_sidecar(png.with_suffix(".json"))
    assert side["schema"] == render_export.SIDECAR_SCHEMA and isinstance(side["gradscope_version"], str)
    assert side["method"] == "cmwp" and side["target"] == {"index": 281}
    assert side["alpha"] == 0.5 and side["shape"] == [9, 13] and side["changed"] == ["a", "b"]
    assert side["path"] == str(tmp_path / "in.png") and side["nan_stat"] == "NaN"
    text = png.with_suffix(".json").read_text()
    assert text == json.dumps(side, indent=2, sort_keys=True) + "\n"  # sorted, indented, strict JSON


def test_unserialisable_sidecar_writes_nothing(tmp_path: Path, picture: np.ndarray) -> None:
    with pytest.raises(TypeError, match="sidecar"):
        save_png(tmp_path / "x.png", picture, {"bad": object()})
    assert list(tmp_path.iterdir()) == []


def test_overwrite_is_atomic_replace(tmp_path: Path, picture: np.ndarray) -> None:
    p = save_png(tmp_path / "x.png", picture, {"n": 1})
    save_png(p, 255 - picture, {"n": 2})
    with Image.open(p) as im:
        np.testing.assert_array_equal(np.asarray(im), 255 - picture)
    assert load_sidecar(p)["n"] == 2
    assert sorted(q.name for q in tmp_path.iterdir()) == ["x.json", "x.png"]


def test_rejects_non_uint8_and_json_suffix(tmp_path: Path, picture: np.ndarray) -> None:
    with pytest.raises(ValueError, match="uint8"):
        save_png(tmp_path / "x.png", picture.astype(np.float32))
    with pytest.raises(ValueError, match=".json"):
        save_png(tmp_path / "x.json", picture, {})
