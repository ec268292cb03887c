"""One export pipeline: the same result with the same view gives the same PNG bytes and the same sidecar
from the GUI's Session, the CLI and the API; exports never overwrite an input."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from gradscope.app.session import Session
from gradscope.backend import keras
from gradscope.cli import EXIT_USER_ERROR, main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from skimage import data

    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inp)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    out = keras.layers.Dense(3, activation="softmax", name="probs")(x)
    folder = tmp_path_factory.mktemp("inputs")
    keras.Model(inp, out).save(folder / "net.keras")
    Image.fromarray(data.astronaut()).resize((40, 32)).save(folder / "cat.png")
    return folder


@pytest.mark.parametrize("method", ["gradient", "guided_backprop"])
def test_gui_and_cli_exports_of_the_same_result_are_identical(files, tmp_path, method):
    model, image = str(files / "net.keras"), str(files / "cat.png")
    s = Session()  # inline executor: jobs run at once
    s.open_model(model)
    s.fed.open(image)
    s.targeting.set_class(1)
    s.editor.apply_method(method)
    assert s.result is not None and not s.result_is_stale
    gui = s.exports.overlay(tmp_path / "gui.png")
    cli = tmp_path / "cli.png"
    assert main(["explain", model, image, "--method", method, "--target", "1", "--out", str(cli)]) == 0
    assert gui.read_bytes() == cli.read_bytes()
    gui_side = json.loads(gui.with_suffix(".json").read_text())
    cli_side = json.loads(cli.with_suffix(".json").read_text())
    assert gui_side == cli_side
    assert gui_side["view"]["style"] == "caffe" and gui_side["target"]["class_index"] == 1


def test_an_export_never_replaces_an_input(files, tmp_path, capsys):
    plan = tmp_path / "myplan.json"
    plan.write_text(json.dumps({"entries": [{"select": "conv", "rule": "zero"}]}))
    before = plan.read_text()
    code = main(
        [
            "explain",
            str(files / "net.keras"),
            str(files / "cat.png"),
            "--plan",
            str(plan),
            "--out",
            str(tmp_path / "myplan.png"),
        ]
    )
    assert code == EXIT_USER_ERROR and "inputs" in capsys.readouterr().err
    assert plan.read_text() == before and not (tmp_path / "myplan.png").exists()


def test_images_with_one_stem_get_one_overlay_each_and_the_renames_are_listed(files, tmp_path, capsys):
    folder = tmp_path / "imgs"
    folder.mkdir()
    picture = Image.open(files / "cat.png")
    picture.save(folder / "cat.png")
    picture.save(folder / "cat.jpg")
    picture.save(folder / "cat_png.bmp")  # its natural name, cat_png_gradient.png, is cat.png's renamed one
    out = tmp_path / "out"
    assert main(["-q", "explain", str(files / "net.keras"), str(folder), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == [
        "cat_jpg_gradient.png",
        "cat_png_gradient.png",
        "cat_png_gradient_2.png",
    ]
    err = capsys.readouterr().err
    assert "3 output name(s) changed" in err
    assert "cat.jpg -> cat_jpg_gradient.png (another image has the same name)" in err
    assert "cat_png.bmp -> cat_png_gradient_2.png (an earlier image's overlay has this name)" in err


def test_map_only_png_and_raw_signal_npy_are_the_same_from_the_gui_the_cli_and_the_api(files, tmp_path):
    import numpy as np

    from gradscope.api import explain

    model, image = str(files / "net.keras"), str(files / "cat.png")
    s = Session()
    s.open_model(model)
    s.fed.open(image)
    s.targeting.set_class(2)
    gui_map = s.exports.overlay(tmp_path / "gui_map.png", map_only=True)
    gui_npy = s.exports.signal(tmp_path / "gui_signal")
    assert gui_npy.suffix == ".npy"
    cli = tmp_path / "cli.png"
    assert main(["explain", model, image, "--target", "2", "--map-only", "--npy", "--out", str(cli)]) == 0
    assert gui_map.read_bytes() == cli.read_bytes()
    signal = np.load(gui_npy)
    np.testing.assert_array_equal(signal, np.load(tmp_path / "cli_signal.npy"))
    np.testing.assert_array_equal(signal, s.signal())  # what the map on screen is reduced from
    api = explain(model, image, target=2)
    np.testing.assert_array_equal(np.load(api.save_signal(tmp_path / "api.npy")), signal)
    side = json.loads((tmp_path / "gui_signal.json").read_text())
    assert side["export"] == {"kind": "signal", "shape": list(signal.shape), "dtype": "float32"}
    assert json.loads(gui_map.with_suffix(".json").read_text())["export"]["map_only"] is True
    with Image.open(gui_map) as im:  # the map alone: no pixel of the photo under it
        overlay = s.exports.overlay(tmp_path / "blend.png")
        with Image.open(overlay) as blend:
            assert im.size == blend.size and np.asarray(im).tobytes() != np.asarray(blend).tobytes()
