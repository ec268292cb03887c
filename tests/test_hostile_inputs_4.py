"""Bad input, round 4 (issue 35): names that tried to write outside --out, internal errors turned into one clear
line, writes that lost data, token ids from arrays, repeated vocabulary words and class-map keys."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import gradscope.api as gs
from gradscope.cli import main
from gradscope.core.errors import EXIT_USER_ERROR, InputError
from gradscope.io.demo import demo_image_paths, demo_model_path
from gradscope.io.sequences import Vocabulary, parse_token_ids, read_token_file
from gradscope.rules.base import load_rule_file

keras = pytest.importorskip("keras")


def _images(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, src in enumerate(demo_image_paths()[:n]):
        (folder / f"img{i}.png").write_bytes(Path(src).read_bytes())
    return folder


@pytest.mark.parametrize(
    "name",
    ["../../../victimdir/settings", "/abs/olute/name", "a/b\\c", "nul\x00byte", "x" * 200, "..", "dot.dot/../.."],
)
def test_a_plan_name_never_writes_outside_out_and_no_overlay_replaces_another(tmp_path, name, capsys):
    images = _images(tmp_path / "images")
    victim = tmp_path / "victimdir"
    victim.mkdir()
    (victim / "settings.json").write_text("precious")
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"name": name, "entries": [{"select": "conv1", "rule": "zero"}]}))
    out = tmp_path / "out" / "deeper"
    assert main(["-q", "explain", str(demo_model_path()), str(images), "--plan", str(plan), "--out", str(out)]) == 0
    assert (victim / "settings.json").read_text() == "precious" and sorted(os.listdir(victim)) == ["settings.json"]
    written = sorted(os.listdir(out))
    assert len([w for w in written if w.endswith(".png")]) == 3 and len(written) == 6  # 3 overlays + 3 sidecars
    assert all((out / w).is_file() for w in written)  # nothing but files directly in --out
    everything = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    outside = everything - {f"out/deeper/{w}" for w in written}
    assert outside == {"p.json", "victimdir/settings.json", "images/img0.png", "images/img1.png", "images/img2.png"}
    assert "\x00" not in capsys.readouterr().err


def test_debug_and_quiet_work_after_the_command_too(tmp_path, capsys):
    out = tmp_path / "o.png"
    assert main(["explain", "--out", str(out), "--debug", "-q"]) == 0
    assert out.is_file() and capsys.readouterr().err == ""  # -q after the command silenced it


def test_numbers_and_outputs_are_checked_before_use(tmp_path, capsys):
    data = _images(tmp_path / "data", 1)
    demo = str(demo_model_path())
    assert main(["evaluate", demo, str(data), "--batch", "100000000", "--out", str(tmp_path / "e")]) == 2
    assert "batch must be a whole number from 1 to 4096" in capsys.readouterr().err
    a_file = tmp_path / "results.txt"
    a_file.write_text("mine")
    assert main(["evaluate", demo, str(data), "--out", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err and a_file.read_text() == "mine"
    assert main(["flow", demo, "--label", "0", "--png", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_flow_csv_on_a_full_disk_keeps_the_old_file_whole(tmp_path, monkeypatch, capsys):
    import errno

    from gradscope.core import files

    csv = tmp_path / "flow.csv"
    assert main(["-q", "flow", str(demo_model_path()), "--label", "0", "--csv", str(csv)]) == 0
    before = csv.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    assert main(["-q", "flow", str(demo_model_path()), "--label", "1", "--csv", str(csv)]) == 2
    assert "No space left" in capsys.readouterr().err
    assert csv.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["flow.csv"]


def test_an_overlay_is_never_left_without_its_sidecar(tmp_path, monkeypatch, capsys):
    import errno

    from gradscope.core import files

    real, calls = files.os.fsync, []

    def sidecar_fails(fd):
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(files.os, "fsync", sidecar_fails)
    assert main(["-q", "explain", "--out", str(tmp_path / "new.png")]) == 2
    assert "No space left" in capsys.readouterr().err and os.listdir(tmp_path) == []


def test_token_ids_far_past_int64_and_vocabularies_of_random_bytes_are_one_line(tmp_path):
    with pytest.raises(InputError, match="far beyond any vocabulary"):
        parse_token_ids("5 " + "9" * 40)
    ids = tmp_path / "ids.json"
    ids.write_text("[1, 2, 100000000000000000000000]")
    with pytest.raises(InputError, match="ids.json: token 2"):
        read_token_file(ids)
    noise = tmp_path / "vocab.txt"
    noise.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError, match=r"vocab.txt is not UTF-8 text \(byte 128, line 2"):
        Vocabulary.load(noise)


def test_a_repeated_vocabulary_word_or_class_map_key_is_named(tmp_path):
    from gradscope.io.datasets import load_class_map

    lines = tmp_path / "vocab.txt"
    lines.write_text("[PAD]\nthe\ncat\nthe\n")
    with pytest.raises(InputError, match="'the' is on line 2 and line 4"):
        Vocabulary.load(lines)
    listed = tmp_path / "vocab.json"
    listed.write_text('["a", "b", "a"]')
    with pytest.raises(InputError, match="'a' is on item 0 and item 2"):
        Vocabulary.load(listed)
    mapped = tmp_path / "map.json"
    mapped.write_text('{"a": 0,\n "b": 1,\n "a": 2}')
    with pytest.raises(InputError, match=r"'a' is given twice \(line 3\)"):
        Vocabulary.load(mapped)
    same_id = tmp_path / "ids.json"
    same_id.write_text('{"a": 0, "b": 0}')
    with pytest.raises(InputError, match="both have id 0"):
        Vocabulary.load(same_id)
    classes = tmp_path / "classes.json"
    classes.write_text('{"1": 0,\n"15": 14,\n"1": 3}')
    with pytest.raises(Exception, match=r"'1' is given twice \(line 3\)"):
        load_class_map(classes)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(Exception, match="nested 100000 levels deep"):
        load_class_map(deep)


def test_json_nested_100000_deep_is_one_line_for_plans_and_sessions(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["explain", "--plan", str(deep), "--out", str(tmp_path / "o.png")]) == EXIT_USER_ERROR
    assert "nested 100000 levels deep" in capsys.readouterr().err
    from gradscope.app.files.session_files import SessionFileError, read_session_file

    session = tmp_path / "deep.gradscope.json"
    session.write_text('{"model": ' * 50_000 + "1" + "}" * 50_000)
    with pytest.raises(SessionFileError, match="levels deep"):
        read_session_file(session)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    keras.utils.set_random_seed(3)
    i = keras.Input((6,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(20, 4, name="embed")(i)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    o = keras.layers.Dense(3, name="out")(h)
    path = tmp_path_factory.mktemp("text") / "text.keras"
    keras.Model(i, o).save(path)
    return path


@pytest.mark.parametrize("kind", ["npy", "npy batch of one", "npz by name", "npz unnamed"])
def test_token_ids_from_arrays_go_the_way_of_tokens(text_model, tmp_path, kind):
    ids = np.array([2, 3, 4, 5, 6, 9])
    path = tmp_path / ("ids.npz" if "npz" in kind else "ids.npy")
    if kind == "npy":
        np.save(path, ids)
    elif kind == "npy batch of one":
        np.save(path, ids[None].astype(np.int32))
    elif kind == "npz by name":
        np.savez(path, tokens=ids)
    else:
        np.savez(path, ids)
    from_array = gs.explain(text_model, path, target=1)
    from_tokens = gs.explain(text_model, ids, target=1)
    assert from_array.node == "embed" and from_array.labels == tuple(map(str, ids))
    np.testing.assert_allclose(from_array.saliency, from_tokens.saliency, rtol=1e-6)
    assert np.abs(from_array.saliency).max() > 0


def test_the_same_rule_name_twice_in_one_file_is_an_error(tmp_path):
    twice = tmp_path / "twice.py"
    twice.write_text(
        "from gradscope.rules.base import Rule, register_rule\n\n"
        "@register_rule('_twice_in_one_file')\nclass First(Rule):\n    pass\n\n"
        "@register_rule('_twice_in_one_file')\nclass Second(Rule):\n    pass\n"
    )
    with pytest.raises(Exception, match=r"decorates two classes \(First and Second\)"):
        load_rule_file(twice)
    once = tmp_path / "once.py"
    once.write_text(
        "from gradscope.rules.base import Rule, register_rule\n\n"
        "@register_rule('_once_in_a_file')\nclass Only(Rule):\n    pass\n"
    )
    assert load_rule_file(once) == ["_once_in_a_file"] and load_rule_file(once) == ["_once_in_a_file"]  # reload


def test_a_huge_plan_name_is_refused_in_one_short_line(tmp_path, capsys):
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"name": "n" * 5_000_000, "entries": []}))
    assert main(["explain", "--plan", str(plan), "--out", str(tmp_path / "o.png")]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "length <= 200" in err and len(err) < 400


def test_a_png_image_named_like_its_neighbour_gets_a_suffix_not_an_overwrite(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    pixels = np.full((32, 32, 3), 100, np.uint8)
    Image.fromarray(pixels).save(folder / "cat.png")
    Image.fromarray(pixels).save(folder / "cat.jpg")
    out = tmp_path / "out"
    assert main(["-q", "explain", str(demo_model_path()), str(folder), "--out", str(out)]) == 0
    assert len(list(out.glob("*.png"))) == 2
