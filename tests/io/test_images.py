"""Image reading and model-input preparation with real images from scikit-image (shipped offline)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gradscope.core.errors import ImageLoadError
from gradscope.io.images import list_images, load_image, prepare_input

skdata = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    return skdata.astronaut()  # uint8 (512, 512, 3)


def test_png_round_trip_is_exact(tmp_path, astronaut):
    path = tmp_path / "astronaut.png"
    Image.fromarray(astronaut).save(path)
    img = load_image(path)
    assert img.dtype == np.uint8 and img.shape == (512, 512, 3)
    np.testing.assert_array_equal(img, astronaut)


def test_jpeg_and_resize(tmp_path, astronaut):
    path = tmp_path / "astronaut.jpg"
    Image.fromarray(astronaut).save(path, quality=95)
    img = load_image(path)
    assert img.shape == (512, 512, 3)
    assert np.abs(img.astype(float) - astronaut).mean() < 4.0  # lossy, but close
    small = load_image(path, size=(100, 60))
    assert small.shape == (100, 60, 3)
    assert load_image(path, size=32).shape == (32, 32, 3)


def test_grayscale_file_becomes_rgb_and_modes(tmp_path):
    camera = skdata.camera()  # uint8 (512, 512)
    path = tmp_path / "camera.png"
    Image.fromarray(camera).save(path)
    rgb = load_image(path)
    assert rgb.shape == (512, 512, 3)
    np.testing.assert_array_equal(rgb[..., 0], camera)
    assert load_image(path, mode="L").shape == (512, 512)
    assert load_image(path, mode="RGBA").shape == (512, 512, 4)


def test_sixteen_bit_png_is_scaled(tmp_path):
    a = (np.linspace(0, 65535, 64 * 64).reshape(64, 64)).astype(np.uint16)
    path = tmp_path / "deep.png"
    Image.fromarray(a).save(path)
    img = load_image(path)
    assert img[0, 0, 0] == 0 and img[-1, -1, 0] == 255


def test_missing_and_not_an_image(tmp_path):
    with pytest.raises(ImageLoadError, match="not found") as info:
        load_image(tmp_path / "nope.png")
    assert "nope.png" in str(info.value)
    text = tmp_path / "notes.png"
    text.write_text("not pixels")
    with pytest.raises(ImageLoadError, match="not an image"):
        load_image(text)
    with pytest.raises(ImageLoadError, match="folder"):
        load_image(tmp_path)


def test_truncated_image(tmp_path, astronaut):
    path = tmp_path / "cut.png"
    Image.fromarray(astronaut).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(ImageLoadError, match="damaged or truncated"):
        load_image(path)


def test_list_images(tmp_path, astronaut):
    for name in ["b.PNG", "a.jpg", "c.webp", "d.tif", "e.bmp", "f.jpeg"]:
        Image.fromarray(astronaut[:16, :16]).save(tmp_path / name)
    (tmp_path / "readme.txt").write_text("x")
    (tmp_path / "sub.png").mkdir()
    names = [p.name for p in list_images(tmp_path)]
    assert names == ["a.jpg", "b.PNG", "c.webp", "d.tif", "e.bmp", "f.jpeg"]
    with pytest.raises(ImageLoadError, match="not found"):
        list_images(tmp_path / "missing")


def test_prepare_input_resizes_and_scales(astronaut):
    x = prepare_input(astronaut, (None, 64, 48, 3))
    assert x.shape == (1, 64, 48, 3) and x.dtype == np.float32
    assert x.min() >= 0.0 and x.max() <= 1.0
    expected = np.asarray(Image.fromarray(astronaut).resize((48, 64), Image.Resampling.BILINEAR)) / 255.0
    np.testing.assert_allclose(x[0], expected, atol=1e-6)
    raw = prepare_input(astronaut, (64, 48, 3), "raw")
    np.testing.assert_allclose(raw, x * 255.0, atol=1e-3)
    pm = prepare_input(astronaut, (64, 48, 3), "minus_one_one")
    np.testing.assert_allclose(pm, x * 2.0 - 1.0, atol=1e-5)


def test_prepare_input_caffe_is_bgr_minus_mean(astronaut):
    x = prepare_input(astronaut, (32, 32, 3), "caffe")
    raw = prepare_input(astronaut, (32, 32, 3), "raw")
    np.testing.assert_allclose(x[0, ..., 0], raw[0, ..., 2] - 103.939, atol=1e-3)
    np.testing.assert_allclose(x[0, ..., 2], raw[0, ..., 0] - 123.68, atol=1e-3)


def test_prepare_input_channels(astronaut):
    gray = prepare_input(astronaut, (None, 28, 28, 1))
    assert gray.shape == (1, 28, 28, 1)
    camera = skdata.camera()
    rgb = prepare_input(camera, (16, 16, 3))
    assert rgb.shape == (1, 16, 16, 3)
    np.testing.assert_array_equal(rgb[..., 0], rgb[..., 2])
    same = prepare_input(astronaut, (None, None, None, 3))  # variable size: kept as is
    assert same.shape == (1, 512, 512, 3)
    floats = prepare_input(astronaut / 255.0, (512, 512, 3))
    np.testing.assert_allclose(floats, same, atol=1e-6)


@pytest.mark.parametrize("shape", [(None, 10), (None, 8, 8, 2), (None, 5, 4, 3, 2), (100,)])
def test_prepare_input_rejects_non_image_inputs(astronaut, shape):
    with pytest.raises(ImageLoadError, match="not an image") as info:
        prepare_input(astronaut, shape)
    assert str(shape) in str(info.value)


def test_prepare_input_unknown_preprocessing(astronaut):
    with pytest.raises(ImageLoadError, match="minus_one_one"):
        prepare_input(astronaut, (8, 8, 3), "imagenet")
