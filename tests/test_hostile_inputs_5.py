"""Bad input, round 5 (issue 49): sequences longer than a model's positions or its memory, one parser for typed
numbers, a lone surrogate in a vocabulary, an image header that claims 3.6 gigapixels, Pascal VOC split lists
that name missing or repeated images, ``--out`` naming a file, and wrong types at the Python API's edge. (The
monitor's causes are in tests/engine/training/: test_monitor_exits.py, test_monitor_overflow.py.)"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import gradscope.api as gs
from gradscope.cli import main
from gradscope.core.errors import EXIT_USER_ERROR, ArgumentError, ImageLoadError, InputError, TargetError
from gradscope.core.graph import LONG_INPUT_TOKENS
from gradscope.core.numbers import int_or_none
from gradscope.core.targets import Target, whole_number
from gradscope.io import memory
from gradscope.io.datasets import DataProblem, ImageFolder
from gradscope.io.demo import demo_image_paths, demo_model_path
from gradscope.io.images import list_images, load_image
from gradscope.io.model_inputs import _most_tokens, sequence_bytes
from gradscope.io.sequences import Vocabulary, parse_token_ids
from tests.engine.backward.language_models import tiny_causal_lm

keras = pytest.importorskip("keras")
pytest.importorskip("keras_hub")


@pytest.fixture(scope="module")
def gpt2():
    """A tiny GPT-2 whose position embedding has 32 positions."""
    return gs.open_engine(tiny_causal_lm("gpt2"))


@pytest.fixture(scope="module")
def llama():
    return gs.open_engine(tiny_causal_lm("llama"))


# ------------------------------------------------------------------------------------------- sequence length
def test_more_tokens_than_the_position_embedding_has_is_one_line(gpt2, tmp_path, capsys):
    positions, node = gpt2.graph.position_limit()
    assert positions == 32 and node.endswith("/position_embedding")  # the backbone's name depends on what ran before
    with pytest.raises(InputError, match="reads at most 32 tokens .* got 33"):
        gs.model_input(gpt2, np.ones(33, np.int64))
    assert gs.model_input(gpt2, np.ones(32, np.int64)).ids.size == 32
    model = tmp_path / "gpt2.keras"
    gpt2.model.save(model)
    args = ["explain", str(model), "--tokens", " ".join(["5"] * 33), "--out", str(tmp_path / "o.png")]
    assert main(args) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("error") == 1 and "32 positions" in err and "bug" not in err


def test_generation_feeds_the_prompt_and_all_but_the_last_token(gpt2):
    """28 + 5 tokens fit 32 positions (the fifth is never fed back); 28 + 6 do not, and the line says 5 would."""
    prompt = np.arange(1, 29)
    g = gs.explain_generation(gpt2, prompt, steps=5, method="gradient")
    assert g.generation.generated.size == 5
    with pytest.raises(InputError, match="a prompt of 28 leaves room to generate 5"):
        gs.explain_generation(gpt2, prompt, steps=6, method="gradient")


def test_a_sequence_whose_attention_cannot_fit_in_memory_is_refused_before_it_runs(llama, monkeypatch):
    heads = sum(llama.graph.attention_heads())
    assert heads == 8  # two layers of four query heads
    with pytest.raises(
        InputError, match=r"100,000 tokens need about 1,192\.\d GiB \(1,192\.1 GiB for one attention layer"
    ):
        gs.model_input(llama, np.ones(100_000, np.int64))
    # a long prompt (LONG_INPUT_TOKENS on) holds one layer's scores at a time and every node's outputs and signals
    for free in (1 << 30, 8 << 20):  # 1 GiB: a long prompt fits; 8 MiB: only a short one, every layer's scores kept
        monkeypatch.setattr(memory, "available_bytes", lambda free=free: free)
        most = _most_tokens(llama.graph, free)
        attention, nodes = sequence_bytes(llama.graph, most)
        assert attention + nodes <= free < sum(sequence_bytes(llama.graph, most + 1))
        assert (most >= LONG_INPUT_TOKENS) == (free == 1 << 30) and (nodes > 0) == (most >= LONG_INPUT_TOKENS)
        with pytest.raises(InputError, match=f"Give at most about {most:,} tokens"):
            gs.model_input(llama, np.ones(most + 1, np.int64))
        assert gs.model_input(llama, np.ones(most, np.int64)).ids.size == most
        with pytest.raises(InputError, match="Give at most about"):
            gs.explain_generation(llama, np.ones(most - 2, np.int64), steps=4, method="gradient")


def test_sanity_on_a_keras_hub_language_model_reads_the_map_at_the_embedding(gpt2):
    """Called with a list where the model wants its dict of inputs, sanity failed; on token ids it must read the
    map where the signal is (the embedding) and take no finite differences on integer ids."""
    ids = np.array([3, 9, 4, 17, 5])
    report = gs.sanity(gpt2, ids, checks=("randomisation", "finite_differences"))
    feed = {"token_ids": ids[None], "padding_mask": np.ones((1, 5), "int32")}
    logits = np.asarray(gpt2.model(feed))[0, -1]
    assert report.target_value == pytest.approx(float(logits.max()), rel=1e-5)  # the next token's logit
    assert report.randomisation and "<input>" not in [r.node for r in report.finite_differences]
    assert all(not r.flagged for r in report.finite_differences)


# ------------------------------------------------------------------------------------------- numbers
def test_one_parser_reads_whole_numbers_and_nothing_else():
    assert [int_or_none(t) for t in ("7", " +7 ", "-3", "--5", "²", "٣", "1e3", "", "+")] == [
        7,
        7,
        -3,
        None,
        None,
        None,
        None,
        None,
        None,
    ]
    for bad in ("--5", "²", "٣"):
        with pytest.raises(TargetError):
            Target(kind="token", index=bad)
        with pytest.raises(InputError, match="not a token id"):
            parse_token_ids(f"1 {bad}")
        with pytest.raises(TargetError):
            Target.parse(f"neuron:conv1:{bad},0,0")
    assert Target.parse("neuron:conv1:1,-0,+2").neuron == (1, 0, 2)
    with pytest.raises(InputError, match="not a token of the vocabulary"):
        Vocabulary(("a", "b")).token_id("--5")


def test_numbers_are_never_echoed_after_a_lossy_conversion():
    with pytest.raises(TargetError, match="1e"):
        whole_number(1e30, "position")  # not 1000000000000000019884624838656
    assert whole_number(np.uint64(2**64 - 1), "id") == 2**64 - 1
    assert whole_number(np.float32(3.0), "id") == 3
    with pytest.raises(TargetError):
        whole_number(True, "class")


def test_cli_next_token_flags_that_are_no_number_are_one_line(llama, tmp_path, capsys):
    model = tmp_path / "llama.keras"
    llama.model.save(model)
    for flag in ("--next=--5", "--next=²", "--contrast=--1"):
        assert main(["explain", str(model), "--tokens", "1 2 3", flag, "--out", str(tmp_path / "o.png")]) == 2
        err = capsys.readouterr().err
        assert "is not a token id" in err and "bug" not in err
    ids = np.array([3, 2**64 - 1], np.uint64)
    np.save(tmp_path / "ids.npy", ids)
    assert main(["explain", str(model), str(tmp_path / "ids.npy"), "--out", str(tmp_path / "o.png")]) == 2
    assert "18446744073709551615" in capsys.readouterr().err  # not as a negative int64


# ------------------------------------------------------------------------------------------- vocabulary
def test_a_lone_surrogate_in_a_json_vocabulary_is_kept_under_its_escaped_spelling(tmp_path):
    path = tmp_path / "vocab.json"
    path.write_text('["[PAD]", "the", "\\ud800", "cat"]')  # JSON may write half a UTF-16 pair
    vocab = Vocabulary.load(path)
    assert vocab.tokens[2] == "\\ud800" and vocab.token_id("cat") == 3
    keras.utils.set_random_seed(0)
    inp = keras.Input((4,), dtype="int32", name="tokens")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(4, 3)(inp))
    e = gs.explain(keras.Model(inp, keras.layers.Dense(2)(h)), np.array([1, 2, 3, 2]), vocab=vocab)
    e.save(tmp_path / "o.png")
    side = json.loads((tmp_path / "o.json").read_text(encoding="utf-8"))
    assert [p["label"] for p in side["positions"]][:2] == ["the", "\\ud800"]


# ------------------------------------------------------------------------------------------- images
def _png_header(width: int, height: int) -> bytes:
    """A PNG of 57 bytes that claims ``width`` x ``height`` pixels (a signature, IHDR and IEND; no data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_an_image_whose_header_claims_gigapixels_is_refused_by_our_limit_and_listed_in_a_folder(tmp_path, capsys):
    bomb = tmp_path / "images" / "bomb.png"
    bomb.parent.mkdir()
    bomb.write_bytes(_png_header(60_000, 60_000))
    with pytest.raises(ImageLoadError, match="3600 MP .* up to 50 MP"):
        load_image(bomb)
    (tmp_path / "images" / "good.png").write_bytes(Path(demo_image_paths()[0]).read_bytes())
    out = tmp_path / "out"
    assert main(["explain", str(demo_model_path()), str(bomb.parent), "--out", str(out)]) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "1 image(s) could not be read" in err and "bomb.png" in err and "bug" not in err
    assert sorted(p.name for p in out.iterdir()) == ["good_gradient.json", "good_gradient.png"]


def test_a_symlink_loop_among_images_is_listed_not_skipped(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "loop.png").symlink_to(folder / "loop.png")
    assert [p.name for p in list_images(folder)] == ["loop.png"]
    with pytest.raises(ImageLoadError, match="leads nowhere"):
        load_image(folder / "loop.png")


def test_explain_of_a_folder_into_an_existing_file_is_one_line(tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(Path(demo_image_paths()[0]).read_bytes())
    mine = tmp_path / "results.txt"
    mine.write_text("mine")
    assert main(["explain", str(demo_model_path()), str(images), "--out", str(mine)]) == EXIT_USER_ERROR
    assert "is a file" in capsys.readouterr().err and mine.read_text() == "mine"


# ------------------------------------------------------------------------------------------- Pascal VOC
def _voc(root: Path, split_text: bytes, stems: list[str]) -> Path:
    voc = root / "VOC2012"
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (voc / sub).mkdir(parents=True)
    for stem in stems:
        Image.new("RGB", (16, 16), "red").save(voc / "JPEGImages" / f"{stem}.jpg")
        Image.fromarray(np.ones((16, 16), np.uint8), mode="L").save(voc / "SegmentationClass" / f"{stem}.png")
    (voc / "ImageSets" / "Segmentation" / "val.txt").write_bytes(split_text)
    return root


def test_a_voc_split_with_a_bom_repeats_and_missing_images_scores_each_listed_image_once(tmp_path):
    from gradscope.app.evaluation.records import load_samples

    stems = ["2007_000001", "2007_000002", "2007_000003"]
    split = "\ufeff2007_000001\n2007_000002\n2007_000002\n2007_000003\n2007_000404\n".encode()
    folder = ImageFolder(_voc(tmp_path, split, stems), (16, 16, 3))
    keys = folder.keys()
    assert keys == ["2007_000001.jpg", "2007_000002.jpg", "2007_000003.jpg", "2007_000404"]
    samples, bad = load_samples(folder, keys)
    assert [s.key for s in samples] == keys[:3]
    assert bad == [{"key": "2007_000404", "reason": bad[0]["reason"]}]
    assert "val.txt lists it" in bad[0]["reason"] and "JPEGImages/ has no image 2007_000404" in bad[0]["reason"]
    with pytest.raises(DataProblem):
        folder.load("2007_000404")


# ------------------------------------------------------------------------------------------- the Python API
def test_wrong_types_at_the_api_edge_name_the_argument(llama):
    model, image = str(demo_model_path()), str(demo_image_paths()[0])
    cases = [
        (dict(vocab=123), "vocab must be"),
        (dict(method=5), "method must be"),
        (dict(plan="p.json"), "plan must be a Plan"),
        (dict(target=2.5), "target must be"),
        (dict(layer=3), "layer must be"),
        (dict(row=-1), "row must be 0 to"),
        (dict(safe_mode="no"), "safe_mode must be"),
    ]
    for kwargs, said in cases:
        with pytest.raises(ArgumentError, match=said):
            gs.explain(model, image, **kwargs)
    assert gs.explain(model, image, target=np.int64(1)).target.index == 1
    assert gs.explain(model, image, target="1").target.index == 1
    for steps in (True, "3", 3.0, 0, 10_000):
        with pytest.raises(ArgumentError, match="steps must be"):
            gs.explain_generation(llama, "1 2 3", steps=steps)
    with pytest.raises(TypeError):  # an ArgumentError is a TypeError too, as Python users expect
        gs.sanity(model, image, method=["gradient"])


# ------------------------------------------------------------------------------------------- borderline
def test_a_vocabulary_of_another_model_is_named_in_the_warnings(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((4,), dtype="int32", name="tokens")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(8, 3)(inp))
    model = keras.Model(inp, keras.layers.Dense(2)(h))
    ids = np.array([1, 2, 3, 2])
    fitting = Vocabulary(tuple(f"w{i}" for i in range(8)), "own.txt")
    assert not [w for w in gs.explain(model, ids, vocab=fitting).warnings if "vocabulary" in w]
    for size in (3, 12):  # fewer than half the embedding's ids, or ids the embedding lacks
        other = Vocabulary(tuple(f"w{i}" for i in range(size)), "other.txt")
        (said,) = [w for w in gs.explain(model, ids, vocab=other).warnings if "vocabulary" in w]
        assert f"has {size} tokens and the model's embedding 8" in said


def test_a_colour_bar_of_a_map_without_a_finite_value_says_so(tmp_path):
    from gradscope.app.files.exports import _with_colorbar
    from gradscope.app.rendering.view import ViewSettings

    picture = np.full((200, 300, 3), 128, np.uint8)
    view = ViewSettings()
    labelled = [_with_colorbar(picture, view, np.full((8, 8), v))[-13:] for v in (np.nan, 0.0)]
    ink = [int((rows < 128).any(axis=-1).sum()) for rows in labelled]
    assert ink[0] > 4 * ink[1]  # a sentence, not "0" at each end


def test_a_log_cut_inside_a_record_after_its_writer_ended_says_so(tmp_path, monkeypatch):
    from gradscope.engine.training import report
    from gradscope.engine.training.monitor import GradientMonitor
    from gradscope.engine.training.report import report_text, training_alerts
    from gradscope.io.training_events import read_training_log
    from tests.engine.training.test_plan_model import batch, mlp

    x, y = batch()
    model = mlp()
    model.compile("sgd", "mse")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[GradientMonitor(tmp_path, every=1)])
    (events,) = tmp_path.glob("events.out.tfevents.*")
    whole = read_training_log(tmp_path)
    assert whole.cut_bytes == 0 and "cut short" not in report_text(whole, training_alerts(whole))
    events.write_bytes(events.read_bytes()[:-30])  # the disk filled in the middle of the last record
    log = read_training_log(tmp_path)
    assert log.cut_bytes > 0 and "cut short" not in report_text(log, [])  # its writer (this process) lives
    monkeypatch.setattr(report.os, "kill", lambda pid, sig: (_ for _ in ()).throw(ProcessLookupError()))
    text = report_text(log, training_alerts(log))
    assert f"the log is cut short: it ends inside a record ({log.cut_bytes} bytes" in text
    assert f"after step {log.records[-1].step}" in text
