"""Language models end to end (issue 37): next-token targets (the default, a chosen continuation, a contrast,
a position) in the API, CLI and sidecar; generation attributed token by token; keras_hub's BPE and
SentencePiece tokenizers as vocabularies."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

import gradscope as gs
from gradscope.api import explain_generation
from gradscope.cli import main
from gradscope.core.errors import InputError
from gradscope.core.targets import Target
from gradscope.io.sequences import HubVocabulary, Vocabulary

keras_hub = pytest.importorskip("keras_hub")
keras = pytest.importorskip("keras")

DATA = Path(__file__).resolve().parent / "data" / "lxt"
PROMPT = np.array([2, 61, 66, 86, 57, 75, 80, 24])


@pytest.fixture(scope="module")
def llama():
    return gs.open_engine(DATA / "llama.keras")


def _logits(engine, ids):
    feed = {"token_ids": np.asarray(ids)[None], "padding_mask": np.ones((1, len(ids)), "int32")}
    return engine.model(feed).numpy()[0]


def test_the_default_target_of_a_language_model_is_its_most_likely_next_token(llama):
    logits = _logits(llama, PROMPT)
    top = int(np.argmax(logits[-1]))
    ex = gs.explain(llama, PROMPT, method="gradient_x_input")
    same = gs.explain(llama, PROMPT, method="gradient_x_input", target=Target(kind="token", index=top, position=7))
    assert ex.target.kind == "token" and ex.predicted_class == top
    np.testing.assert_allclose(ex.saliency, same.saliency, rtol=1e-6)
    token = ex.sidecar["explained_token"]
    p = np.exp(logits[-1] - logits[-1].max())
    assert token["id"] == top and token["position"] == 7
    assert token["probability"] == pytest.approx(float(p[top] / p.sum()), rel=1e-5)


def test_a_contrast_is_the_difference_of_its_two_continuations_and_a_position_sees_only_its_past(llama):
    for method in ("gradient_x_input", "attnlrp", "cp_lrp"):
        a = gs.explain(llama, PROMPT, method=method, target=Target(kind="token", index=5, position=4))
        b = gs.explain(llama, PROMPT, method=method, target=Target(kind="token", index=7, position=4))
        ab = gs.explain(llama, PROMPT, method=method, target=Target(kind="token", index=5, contrast=7, position=4))
        np.testing.assert_allclose(ab.saliency, a.saliency - b.saliency, rtol=1e-4, atol=1e-6)
        assert np.all(ab.saliency[5:] == 0)  # causal: positions after 4 play no part
        assert ab.sidecar["explained_token"]["contrast"]["id"] == 7


def test_the_default_position_is_the_last_real_token_before_padding(llama):
    engine = llama
    ids = np.concatenate([PROMPT, [0, 0, 0]])
    mask = np.array([1] * len(PROMPT) + [0, 0, 0])
    xs = [{"token_ids": ids[None], "padding_mask": mask[None]}[i] for i in engine.graph.input_ids]
    padded = engine.backward(xs, Target(kind="token"), gs.Plan())
    assert int(padded.target_indices[0]) == int(np.argmax(_logits(engine, PROMPT)[-1]))
    assert engine.token_position(Target(kind="token"), xs) == len(PROMPT) - 1


def test_the_cli_explains_a_chosen_continuation_and_says_which_token_and_how_likely(llama, tmp_path, capsys):
    out = tmp_path / "next.png"
    ids = " ".join(map(str, PROMPT))
    assert (
        main(
            [
                "explain",
                str(DATA / "llama.keras"),
                "--tokens",
                ids,
                "--method",
                "attnlrp",
                "--next",
                "5",
                "--contrast",
                "7",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "next token 5" in err and "rather than 7" in err and "p = " in err
    side = gs.read_sidecar(out)
    assert side["explained_token"]["id"] == 5 and side["explained_token"]["contrast"]["id"] == 7
    assert side["target"]["kind"] == "token" and len(side["positions"]) == len(PROMPT)
    # the PNG is headed by the pair it explains (issue 51: it did not say "rather than 7")
    from PIL import Image

    from gradscope.app.files.exports import export_picture
    from gradscope.core.targets import describe_next_token
    from gradscope.render.positions import with_heading

    e = gs.explain(
        str(DATA / "llama.keras"), PROMPT, method="attnlrp", target=gs.Target(kind="token", index=5, contrast=7)
    )
    strip = export_picture(e.images(), e.view())  # the strip as wide as its tokens
    headed = with_heading(strip, describe_next_token(side["explained_token"]).capitalize())
    png = np.asarray(Image.open(out).convert("RGB"))
    assert png.shape == headed.shape and png.shape[0] > strip.shape[0]
    np.testing.assert_array_equal(png[: headed.shape[0] - strip.shape[0]], headed[: png.shape[0] - strip.shape[0]])
    assert main(["explain", "--next", "3", "--out", str(tmp_path / "cnn.png")]) == 2  # the demo CNN is no LM
    assert "for language models" in capsys.readouterr().err
    assert (
        main(
            [
                "explain",
                str(DATA / "llama.keras"),
                "--tokens",
                ids,
                "--next",
                "5",
                "--position",
                "99",
                "--out",
                str(tmp_path / "far.png"),
            ]
        )
        == 2
    )
    assert "Position 99 does not exist" in capsys.readouterr().err


def test_generation_is_greedy_decoding_and_every_row_is_that_tokens_explanation(llama, tmp_path):
    g = explain_generation(llama, PROMPT, steps=4, method="attnlrp")
    ids = list(PROMPT)
    for i in range(4):  # the model's own greedy decoding
        ids.append(int(np.argmax(_logits(llama, ids)[-1])))
        row = gs.explain(llama, np.array(ids[:-1]), method="attnlrp").saliency  # unpadded, one at a time
        np.testing.assert_allclose(g.matrix[i, : len(ids) - 1], row, rtol=1e-4, atol=1e-6)
        assert np.isnan(g.matrix[i, len(ids) - 1 :]).all()
    assert g.generated.tolist() == ids[len(PROMPT) :]
    path = g.save(tmp_path / "gen.png")
    side = gs.read_sidecar(path)
    assert side["generation"]["generated"] == g.generated.tolist() and side["generation"]["scores_csv"]
    rows = (tmp_path / side["generation"]["scores_csv"]).read_text().splitlines()
    assert len(rows) == 5 and rows[1].split(",")[1] == str(g.generated[0])
    assert float(rows[1].split(",")[4]) == pytest.approx(g.matrix[0, 0], rel=1e-6)


def test_the_cli_generates_and_refuses_what_it_cannot(tmp_path, capsys):
    out = tmp_path / "gen.png"
    model = str(DATA / "gpt2.keras")
    assert main(["-q", "explain", model, "--tokens", "2 61 66 86", "--generate", "3", "--out", str(out)]) == 0
    assert out.is_file() and (tmp_path / "gen_scores.csv").is_file() and (tmp_path / "gen.json").is_file()
    for bad, says in ((["--generate", "0"], "1 to 512"), (["--generate", "100000"], "1 to 512")):
        assert main(["explain", model, "--tokens", "2 61", *bad, "--out", str(out)]) == 2
        assert says in capsys.readouterr().err


def _spm_tokenizer():
    import sentencepiece as spm

    corpus = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "cats and dogs sat"] * 20
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=model,
        vocab_size=40,
        model_type="bpe",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        pad_piece="<pad>",
        unk_piece="<unk>",
        bos_piece="<bos>",
        eos_piece="<eos>",
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        minloglevel=2,
    )
    return keras_hub.tokenizers.GemmaTokenizer(proto=model.getvalue())


def _bpe_tokenizer():
    vocab = {
        "<|endoftext|>": 0,
        "t": 1,
        "h": 2,
        "e": 3,
        "Ġ": 4,
        "c": 5,
        "a": 6,
        "th": 7,
        "the": 8,
        "Ġc": 9,
        "Ġca": 10,
        "Ġcat": 11,
    }
    return keras_hub.tokenizers.GPT2Tokenizer(vocabulary=vocab, merges=["t h", "th e", "Ġ c", "Ġc a", "Ġca t"])


@pytest.mark.parametrize("make", [_spm_tokenizer, _bpe_tokenizer], ids=["sentencepiece trained here", "BPE by hand"])
def test_language_model_tokenizers_are_vocabularies_that_start_the_text_as_the_model_saw_it(make, tmp_path):
    tokenizer = make()
    tokenizer.save_to_preset(str(tmp_path))
    vocab = Vocabulary.load(tmp_path)
    assert isinstance(vocab, HubVocabulary) and len(vocab) == tokenizer.vocabulary_size()
    ids = vocab.encode("the cat")
    want = np.asarray(tokenizer.tokenize("the cat")).tolist()
    assert ids.tolist() == [tokenizer.start_token_id, *want]  # the causal-LM preprocessor's start token
    assert vocab.token_id(" cat" if "Ġcat" in vocab.tokens else "cat") == want[-1]
    with pytest.raises(InputError, match="tokens"):
        vocab.token_id("the cat sat")


def test_typed_text_through_a_bpe_tokenizer_explains_the_next_word(tmp_path, capsys):
    _bpe_tokenizer().save_to_preset(str(tmp_path / "tok"))
    keras.utils.set_random_seed(2)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=12, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16
    )
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    model.save(tmp_path / "lm.keras")
    out = tmp_path / "words.png"
    assert (
        main(
            [
                "explain",
                str(tmp_path / "lm.keras"),
                "--text",
                "the cat",
                "--vocab",
                str(tmp_path / "tok"),
                "--next",
                " cat",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    side = json.loads(out.with_suffix(".json").read_text())
    # byte-level pieces read as the text they stand for ("Ġcat" is " cat")
    assert [p["label"] for p in side["positions"]] == ["<|endoftext|>", "the", " cat"]
    assert side["explained_token"]["label"] == " cat" and side["explained_token"]["id"] == 11


def test_front_door_calls_on_one_folder_open_it_once_until_it_changes(tmp_path):
    """A notebook's ``gs.explain(folder, ...)`` cells each loaded the folder again, and Keras numbered every copy
    (``gpt2_causal_lm_1``, ``_2``...): the sidecar named a different model each time."""
    import shutil

    from gradscope.api.inputs import engine_for

    folder = tmp_path / "gpt2"
    shutil.copytree(DATA.parent / "hf" / "gpt2", folder)
    first = gs.explain(folder, "the cat sat on the", method="gradient")
    again = gs.explain(str(folder), "the cat sat", method="gradient")
    assert first.sidecar["model"] == again.sidecar["model"]
    engine = engine_for(folder)
    assert engine_for(str(folder)) is engine and gs.open_engine(folder) is not engine  # open_engine: a new copy
    (folder / "config.json").write_text((folder / "config.json").read_text() + "\n")  # changed on disk: reopened
    assert engine_for(folder) is not engine


def test_the_bundled_language_model_finishes_its_sentences_and_its_map_points_at_the_subject(tmp_path, monkeypatch):
    """``demo:tiny_gpt2`` (scripts/demo_language_model.py) opens from any folder; a word for ``--next`` is the token
    that continues a text (" mat") when the bare word is not one token."""
    monkeypatch.chdir(tmp_path)
    e = gs.explain("demo:tiny_gpt2", "the dog and the bird slept near the", method="attnlrp")
    told = e.sidecar["explained_token"]
    assert told["label"] == " tree" and told["probability"] > 0.5  # the nearer subject names the place
    words = [w.strip() for w in e.labels]
    assert words[int(np.argmax(e.saliency))] == "bird"
    from gradscope.api.inputs import vocabulary

    vocab = vocabulary(None, "demo:tiny_gpt2", "the cat")
    assert vocab.token_id("tree") == vocab.token_id(" tree") == told["id"] != vocab.token_id("0")


def test_the_window_exports_a_token_strip_as_the_cli_does(tmp_path):
    """One export for both: the window's was a 1024 px strip without its heading, three quarters white."""
    from PIL import Image

    from gradscope.app.session import Session
    from gradscope.app.work.worker import InlineExecutor
    from gradscope.core.resources import resource_path

    folder = resource_path("demo", "tiny_gpt2")
    text = "the cat sat near the"
    assert (
        main(["explain", str(folder), "--text", text, "--method", "attnlrp", "--out", str(tmp_path / "cli.png")]) == 0
    )
    s = Session(InlineExecutor())
    s.document.open(str(folder))
    s.fed.set_typed(text)
    assert s.editor.apply_method("attnlrp")
    window = s.exports.overlay(tmp_path / "window.png")
    cli_picture, window_picture = (np.asarray(Image.open(p).convert("RGB")) for p in (tmp_path / "cli.png", window))
    np.testing.assert_array_equal(window_picture, cli_picture)
    assert window_picture.shape[1] < 600  # six tokens and the heading, not 1024 px
    cli_sidecar, window_sidecar = (
        json.loads(p.with_suffix(".json").read_text()) for p in (tmp_path / "cli.png", window)
    )
    assert window_sidecar["explained_token"] == pytest.approx(cli_sidecar["explained_token"])
    assert window_sidecar["explained_token"]["label"] == " mat"
