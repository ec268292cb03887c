"""Files the user writes or edits are checked against their declared format in every front end: a typo in a
plan is one line and exit 2 (it used to apply the rule to every node), a BOM is read, rule parameters are
checked not coerced, and every sidecar gradscope writes reads back valid."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradscope.app.files.exports import ExportError, read_sidecar
from gradscope.app.files.session_files import SessionFileError, read_session_file
from gradscope.cli import EXIT_USER_ERROR, main
from gradscope.core.errors import PlanError, TargetError
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan
from tests.engine.fixtures import tiny_cnn

TYPO = {"entries": [{"selector": "type:ReLU", "rule": "backward_as", "params": {"activation": "sigmoid"}}]}


@pytest.mark.parametrize("command", ["explain", "snippet"])
def test_a_misspelt_plan_key_stops_the_command_with_the_place_and_the_fix(tmp_path, capsys, command):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(TYPO))
    out = tmp_path / ("o.png" if command == "explain" else "train.py")
    assert main([command, "--plan", str(plan), "--out", str(out)]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "entry 0: unknown key 'selector'; did you mean 'select'?" in err and "Traceback" not in err
    assert not out.exists()


def test_a_plan_saved_with_a_byte_order_mark_runs(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    good = {"entries": [{"select": "type:ReLU", "rule": "backward_as", "params": {"activation": "sigmoid"}}]}
    plan.write_bytes(b"\xef\xbb\xbf" + json.dumps(good).encode())
    assert main(["explain", "--plan", str(plan), "--out", str(tmp_path / "o.png")]) == 0
    sidecar = read_sidecar(tmp_path / "o.png")
    assert sidecar["plan"]["entries"][0]["rule"] == "backward_as"


def test_rule_parameters_are_checked_not_coerced():
    graph = Engine(tiny_cnn()).graph
    Plan().with_entry("*", "scale", {"factor": 2}).resolve(graph)  # a whole number is a number
    for bad, words in (("2", "a number"), (True, "a number"), (None, "a number")):
        with pytest.raises(PlanError, match=f"'factor' must be {words}"):
            Plan().with_entry("*", "scale", {"factor": bad}).resolve(graph)


def test_a_session_file_with_a_typo_is_refused_before_anything_changes(tmp_path):
    p = tmp_path / "s.gradscope.json"
    p.write_text(json.dumps({"model": "m.keras", "view": {"colormap": "jet", "alpah": 0.3}}))
    with pytest.raises(SessionFileError, match="view: unknown key 'alpah'; did you mean 'alpha'"):
        read_session_file(p)
    p.write_text(json.dumps({"model": "m.keras", "selectd": "c1"}))
    with pytest.raises(SessionFileError, match="unknown key 'selectd'; did you mean 'selected'"):
        read_session_file(p)


def test_every_sidecar_gradscope_writes_reads_back_and_a_hand_edit_is_named(tmp_path):
    import gradscope as gs

    image = (np.random.default_rng(0).random((12, 12, 3)) * 255).astype(np.uint8)
    e = gs.explain(tiny_cnn(), image, method="guided_backprop")
    overlay = e.save(tmp_path / "overlay.png")
    signal = e.save_signal(tmp_path / "signal.npy")
    for written in (overlay, signal):
        sidecar = read_sidecar(written)
        assert sidecar["method"] == "guided_backprop" and sidecar["plan"]["entries"]
    side = tmp_path / "overlay.json"
    data = json.loads(side.read_text())
    data["view"]["colour"] = "red"
    side.write_text(json.dumps(data))
    with pytest.raises(ExportError, match="view: unknown key 'colour'; did you mean 'colormap'"):
        read_sidecar(overlay)


@pytest.mark.parametrize("size", ["0", "-5", "100000"])
def test_an_absurd_export_size_is_one_line_and_exit_2_before_any_work(tmp_path, capsys, size):
    assert main(["explain", "--size", size, "--out", str(tmp_path / "o.png")]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "from 16 to 8192" in err and not (tmp_path / "o.png").exists()


def test_an_array_input_is_sized_from_its_header_before_it_is_read(tmp_path, capsys, monkeypatch):
    from gradscope.io import arrays

    monkeypatch.setattr(arrays, "MAX_INPUT_BYTES", 1000)
    big = tmp_path / "x.npy"
    np.save(big, np.zeros((2, 64, 64, 3), np.float32))
    assert main(["flow", "--input", str(big), "--label", "1"]) == EXIT_USER_ERROR
    assert "reads array inputs up to" in capsys.readouterr().err


def test_a_non_finite_input_is_a_warning_and_fails_under_strict(tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.full((2, 64, 64, 3), np.nan, np.float32))
    assert main(["flow", "--input", str(x), "--label", "1"]) == 0
    assert "the input has 24576 NaN and 0 Inf of 24576 values" in capsys.readouterr().err
    assert main(["flow", "--input", str(x), "--label", "1", "--strict"]) == 1
    result = Engine(tiny_cnn()).backward(np.full((1, 12, 12, 3), np.inf, np.float32))
    assert any("0 NaN and 432 Inf" in w for w in result.warnings())


def test_a_npy_whose_header_promises_more_than_the_limit_is_refused_unread(tmp_path, capsys):
    """A header claiming 56 GiB over a few bytes: refused from the header, not by a failing memory map."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 224, 224, 3), }"
    header += " " * (118 - len(header)) + "\n"
    path = tmp_path / "huge.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    assert main(["flow", "--input", str(path), "--label", "0"]) == EXIT_USER_ERROR
    assert "huge.npy holds 56.1 GiB" in capsys.readouterr().err


@pytest.mark.parametrize(
    "array, dtype",
    [
        (np.zeros((1, 12, 12, 3), np.complex64), "complex64"),
        (np.array([["a"]]), "<U1"),
        (np.array([None], dtype=object), "object"),
    ],
)
def test_inputs_that_are_not_real_numbers_are_refused_not_cast(array, dtype):
    """Complex inputs lost their imaginary part with a NumPy warning; strings were an internal error."""
    with pytest.raises(TargetError, match=f"Input 'img' must hold real numbers; got an array of {dtype}"):
        Engine(tiny_cnn()).backward(array)
