"""The CLI end to end on real files: a saved .keras model, real PNG images, PNG + JSON outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from gradscope.backend import keras
from gradscope.cli import EXIT_USER_ERROR, main


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv")(inp)
    x = keras.layers.MaxPooling2D(name="pool")(x)
    x = keras.layers.Flatten(name="flat")(x)
    out = keras.layers.Dense(3, activation="softmax", name="probs")(x)
    path = tmp_path_factory.mktemp("model") / "tiny.keras"
    keras.Model(inp, out).save(path)
    return path


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory):
    from skimage import data

    folder = tmp_path_factory.mktemp("images")
    Image.fromarray(data.astronaut()).resize((40, 32)).save(folder / "astronaut.png")
    Image.fromarray(data.coffee()).resize((20, 20)).save(folder / "coffee.jpg")
    return folder


def test_graph_prints_node_table(model_file, capsys):
    assert main(["graph", str(model_file)]) == 0
    out = capsys.readouterr().out
    for node_id in ("conv:pre", "conv", "pool", "flat", "probs:pre", "probs"):
        assert node_id in out


def test_explain_writes_overlay_and_sidecar(model_file, image_dir, tmp_path, capsys):
    out = tmp_path / "overlay.png"
    code = main(["explain", str(model_file), str(image_dir / "astronaut.png"), "--target", "1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    img = np.asarray(Image.open(out))
    assert img.shape == (410, 512, 3)  # the image's aspect (40x32), at least 512 px on the long side
    sidecar = json.loads(out.with_suffix(".json").read_text())
    assert sidecar["target"] == {"kind": "class", "index": 1, "class_index": 1}  # class_index: the one explained
    assert sidecar["method"] == "gradient"
    assert sidecar["model_file"] == str(model_file)
    assert sidecar["plan"]["entries"] == []
    assert sidecar["export"] == {"size": [512, 410], "colorbar": False, "map_only": False}


def test_explain_with_plan_file_and_layer(model_file, image_dir, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {"entries": [{"select": "activation:relu", "rule": "backward_as", "params": {"activation": "sigmoid"}}]}
        )
    )
    out = tmp_path / "o.png"
    code = main(
        [
            "explain",
            str(model_file),
            str(image_dir / "coffee.jpg"),
            "--plan",
            str(plan),
            "--layer",
            "conv",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    sidecar = json.loads(out.with_suffix(".json").read_text())
    assert sidecar["readout_node"] == "conv"
    assert sidecar["changed_nodes"] == ["conv"]


def test_explain_folder_writes_one_overlay_per_image(model_file, image_dir, tmp_path, capsys):
    out = tmp_path / "overlays"
    assert main(["explain", str(model_file), str(image_dir), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["astronaut_gradient.png", "coffee_gradient.png"]
    assert "2/2" in capsys.readouterr().err  # the progress bar


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["graph", "/no/such/model.keras"], "not found"),
        (["explain", "{model}", "{image}", "--target", "7"], "Class 7 does not exist"),
        (["explain", "{model}", "{image}", "--target", "neuron:x"], "Cannot read target"),
        (["explain", "{model}", "{image}", "--layer", "nope"], "No node 'nope'"),
        (["explain", "{model}", "{image}", "--method", "nope"], "Unknown method"),
        (["explain", "{model}", "/no/such.png"], "/no/such.png"),
    ],
)
def test_user_errors_are_one_line_without_traceback(model_file, image_dir, capsys, argv, message):
    argv = [a.format(model=model_file, image=image_dir / "astronaut.png") for a in argv]
    assert main(argv) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith("gradscope: error:")


def test_python_dash_m_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "gradscope", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "explain" in out.stdout


def test_ctrl_c_ends_a_rule_stuck_in_native_code(tmp_path):
    """An endless tf.while_loop never returns to Python, so KeyboardInterrupt alone could not stop the CLI."""
    import os
    import signal
    import time

    rules = tmp_path / "spin_rules.py"
    rules.write_text(
        "import os\n"
        "import tensorflow as tf\n"
        "from gradscope import Rule, register_rule\n\n"
        "@tf.function\n"
        "def spin():\n"
        "    return tf.while_loop(lambda i: i >= 0.0, lambda i: i + 1.0, [tf.constant(0.0)])\n\n"
        "@register_rule('spin_forever')\n"
        "class SpinForever(Rule):\n"
        "    def backward(self, ctx, grad_outputs):\n"
        "        open(os.environ['SPIN_MARKER'], 'w').write('x')\n"
        "        spin()\n"
        "        return list(grad_outputs)\n"
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"entries": [{"select": "conv1", "rule": "spin_forever"}]}))
    marker = tmp_path / "started"
    env = {**os.environ, "SPIN_MARKER": str(marker)}
    cmd = [
        sys.executable,
        "-m",
        "gradscope",
        "explain",
        "--rules",
        str(rules),
        "--plan",
        str(plan),
        "--out",
        str(tmp_path / "o.png"),
    ]
    # stderr goes to a file: a pipe nobody reads until the child exits fills up (64 KB of TensorFlow warnings)
    # and then blocks the child's last message, so the child never ends (seen once in CI)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        # as at a terminal: a suite started in the background by a non-interactive shell (as CI may be) has
        # SIGINT ignored, the child would inherit that, and no Ctrl-C could ever reach it
        proc = subprocess.Popen(
            cmd, env=env, stderr=err, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
        )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), err_path.read_text() if proc.poll() is not None else "the rule never started"
        time.sleep(0.5)  # inside the native loop now
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the CLI did not end 30 s after Ctrl-C; its stderr ends:\n" + err_path.read_text()[-3000:])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130 and "interrupted" in err_path.read_text()


def test_explain_at_a_chosen_size_with_a_colour_bar(model_file, image_dir, tmp_path, capsys):
    out = tmp_path / "big.png"
    code = main(
        ["explain", str(model_file), str(image_dir / "astronaut.png"), "--size", "80", "--colorbar", "--out", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    img = np.asarray(Image.open(out))
    assert img.shape[1] == 80 and img.shape[0] > 64  # 80x64 picture plus the bar below it
    bar_row = img[64 + 4 + 2]  # inside the bar, after a 4 px gap: low end of the colormap left, high end right
    assert not np.array_equal(bar_row[2], bar_row[-3])
    assert json.loads(out.with_suffix(".json").read_text())["export"]["colorbar"] is True


def test_gui_takes_the_window_options(monkeypatch):
    """``gradscope gui --screenshot x.png`` (as CI's install check runs it) reaches the window's own parser."""
    from gradscope.cli import main

    seen = []
    monkeypatch.setattr("gradscope.qt.app.main", lambda argv: seen.append(argv) or 0)
    assert main(["gui", "--size", "1024x640", "--screenshot", "x.png"]) == 0
    assert main(["--debug", "gui", "m.keras", "--no-demo"]) == 0
    assert seen == [["--size", "1024x640", "--screenshot", "x.png"], ["m.keras", "--no-demo"]]


def test_ctrl_c_inside_a_c_function_is_an_interrupt_not_an_internal_error(monkeypatch, capsys):
    """Python turns a Ctrl-C that lands in a C function returning a value into a SystemError caused by it."""
    import gradscope.rules.methods as methods

    def interrupted_in_c():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise SystemError("<built-in method __array__> returned a result with an exception set") from exc

    monkeypatch.setattr(methods, "available_methods", interrupted_in_c)
    assert main(["methods"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "internal error" not in err
    monkeypatch.setattr(methods, "available_methods", lambda: (_ for _ in ()).throw(SystemError("a real bug")))
    assert main(["methods"]) == 3 and "internal error" in capsys.readouterr().err


def test_a_large_folders_weights_show_their_progress_on_stderr(capsys):
    """A 16 GB folder reads for a minute: the CLI says how much is read (in a log, a line per quarter)."""
    from gradscope.cli.common import weights_progress

    show = weights_progress("llama3_8b")
    total = 16 << 30
    for done in range(0, total + 1, total // 64):
        show(done, total)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"Opening llama3_8b: {gb:.1f} of 16.0 GB of weights read" for gb in (0, 4, 8, 12, 16)]
    small = weights_progress("tiny")
    small(10, 20)
    assert capsys.readouterr().err == ""
