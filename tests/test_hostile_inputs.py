"""Inputs that used to hang, crash or silently mislead: FIFOs, huge images, sys.exit() in user code, NaN
parameters. Each must be a clear gradscope error."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gradscope.app.files.session_files import SessionFileError, read_session_file
from gradscope.core.errors import ImageLoadError, ModelLoadError, PlanError, RuleError, RuleFileError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.io import images
from gradscope.io.models import load_model
from gradscope.rules.base import Rule, load_rule_file, register_rule
from gradscope.rules.plan import Plan
from tests.engine.fixtures import tiny_cnn


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.png"
    os.mkfifo(path)
    return path


def test_fifos_are_refused_not_read(fifo):
    with pytest.raises(ImageLoadError, match="not a regular file"):
        images.load_image(fifo)
    keras_fifo = fifo.rename(fifo.with_suffix(".keras"))
    with pytest.raises(ModelLoadError, match="not a regular file"):
        load_model(keras_fifo)
    json_fifo = keras_fifo.rename(keras_fifo.with_suffix(".json"))
    with pytest.raises(PlanError, match="not a regular file"):
        Plan.load(json_fifo)
    with pytest.raises(SessionFileError, match="not a regular file"):
        read_session_file(json_fifo)


def test_images_over_the_pixel_limit_are_refused_before_decoding(tmp_path, monkeypatch):
    path = tmp_path / "big.png"
    Image.new("RGB", (40, 30)).save(path)
    monkeypatch.setattr(images, "MAX_PIXELS", 1000)
    with pytest.raises(ImageLoadError, match="40x30"):
        images.load_image(path)
    monkeypatch.setattr(images, "MAX_PIXELS", 1200)
    assert images.load_image(path).shape == (30, 40, 3)


def test_sys_exit_in_a_rule_is_a_rule_error():
    @register_rule("_exits_in_backward", replace=True)
    class Exits(Rule):
        def backward(self, ctx, grad_outputs):
            raise SystemExit(3)

    engine = Engine(tiny_cnn())
    x = np.zeros((1, 12, 12, 3), np.float32)
    for mode in ("live", "compiled"):
        with pytest.raises(RuleError, match="SystemExit"):
            engine.backward(x, Target(), Plan().with_entry("c1", "_exits_in_backward"), mode=mode)


def test_sys_exit_in_a_rule_file_is_a_rule_file_error(tmp_path):
    path = tmp_path / "quits.py"
    path.write_text("import sys\nsys.exit(1)\n")
    with pytest.raises(RuleFileError, match="SystemExit"):
        load_rule_file(path)


@pytest.mark.parametrize("params", [{"factor": "nan"}, {"factor": float("inf")}, {"factor": "-Infinity"}])
def test_non_finite_scale_factors_are_refused(params):
    with pytest.raises(PlanError):
        Plan().with_entry("*", "scale", params).resolve(Engine(tiny_cnn()).graph)


def test_a_nan_clip_bound_is_refused():
    with pytest.raises(PlanError, match="NaN"):
        Plan().with_entry("*", "clip", {"low": float("nan")}).resolve(Engine(tiny_cnn()).graph)


def test_bad_view_values_and_plan_schemas_are_user_errors(tmp_path, capsys):
    from gradscope.cli import EXIT_USER_ERROR, main

    assert main(["explain", "--cmap", "nope", "--out", str(tmp_path / "a.png")]) == EXIT_USER_ERROR
    assert main(["explain", "--alpha", "3", "--out", str(tmp_path / "b.png")]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "colormap 'nope'" in err and "alpha 3.0" in err and "internal error" not in err
    with pytest.raises(PlanError, match="whole number"):
        Plan.from_dict({"schema": "2", "entries": []})


def test_a_batch_continues_past_bad_images_and_lists_them(tmp_path, capsys):
    from gradscope.cli import EXIT_USER_ERROR, main
    from gradscope.io.demo import demo_image_paths, demo_model_path

    folder = tmp_path / "in"
    folder.mkdir()
    for i, src in enumerate(demo_image_paths()[:2]):
        (folder / f"ok{i}.png").write_bytes(Path(src).read_bytes())
    (folder / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "out"
    assert main(["-q", "explain", str(demo_model_path()), str(folder), "--out", str(out)]) == EXIT_USER_ERROR
    assert len(list(out.glob("*.png"))) == 2
    assert "broken.png" in capsys.readouterr().err


def test_an_unmatched_selector_is_a_warning_and_strict_fails(tmp_path, capsys):
    from gradscope.cli import main

    plan = tmp_path / "plan.json"
    plan.write_text('{"entries": [{"select": "type:LSTM", "rule": "zero"}]}')
    assert main(["explain", "--plan", str(plan), "--out", str(tmp_path / "o.png")]) == 0
    assert "type:LSTM" in capsys.readouterr().err
    assert main(["explain", "--plan", str(plan), "--strict", "--out", str(tmp_path / "s.png")]) == 1


def test_a_full_disk_leaves_existing_files_intact(tmp_path, monkeypatch):
    import errno

    from gradscope.core import files
    from gradscope.core.files import FileWriteError

    plan_file = tmp_path / "plan.json"
    Plan().with_entry("*", "zero").save(plan_file)
    before = plan_file.read_text()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(FileWriteError, match="No space left.*left as it was"):
        Plan().save(plan_file)
    assert plan_file.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary file left behind


def test_inf_and_nan_weights_are_named_in_the_result_warnings_and_strict_fails(tmp_path, capsys):
    from gradscope.cli import main

    model = tiny_cnn()
    kernel = model.get_layer("c2").kernel
    poisoned = kernel.numpy()
    poisoned[0, 0, 0, :2] = [np.inf, np.nan]
    kernel.assign(poisoned)
    result = Engine(model).backward(np.ones((1, 12, 12, 3), np.float32), Target(), Plan())
    lines = [w for w in result.warnings() if w.startswith("node ")]
    assert lines == ["node 'c2' has 1 NaN and 1 Inf weight values (c2/kernel)"]
    assert any("outputs are NaN/Inf" in w for w in result.warnings())
    path = tmp_path / "poisoned.keras"
    model.save(path)
    image = tmp_path / "in.png"
    Image.fromarray(np.full((12, 12, 3), 128, np.uint8)).save(image)
    assert main(["explain", str(path), str(image), "--out", str(tmp_path / "o.png")]) == 0
    assert "node 'c2' has 1 NaN and 1 Inf" in capsys.readouterr().err
    assert main(["explain", str(path), str(image), "--strict", "--out", str(tmp_path / "s.png")]) == 1
    assert Engine(tiny_cnn()).weight_problems() == []
