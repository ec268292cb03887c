"""Text and tabular models end to end (issue 23, items 1-2): token ids, words through a vocabulary and CSV rows
in the API and the CLI; one score per token read at the embedding, checked against an independent
GradientTape computation and against completeness on a linear model."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gradscope.api as gs
from gradscope.cli import main
from gradscope.core.errors import EXIT_USER_ERROR, InputError
from gradscope.render import is_signed

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

LENGTH, VOCAB, DIM = 8, 20, 4


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A bag-of-embeddings classifier without biases (linear in the embeddings), saved and loaded."""
    keras.utils.set_random_seed(3)
    i = keras.Input((LENGTH,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(VOCAB, DIM, name="embed")(i)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    o = keras.layers.Dense(3, use_bias=False, activation="softmax", name="out")(h)
    path = tmp_path_factory.mktemp("text") / "text.keras"
    keras.Model(i, o).save(path)
    return path


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(["", "[UNK]", "the", "movie", "was", "great", "!"] + [f"w{i}" for i in range(13)]))
    return path


def tape_token_scores(model, ids, cls, *, norm=False):
    """Independent reference: d logit_cls / d embedding-output, times that output, summed over the dimension
    (``norm``: the L2 norm of that gradient per token, Captum's and Inseq's saliency)."""
    embed = model.get_layer("embed")
    dense = model.get_layer("out")
    e = embed(tf.constant(ids[None]))
    with tf.GradientTape() as tape:
        tape.watch(e)
        logit = tf.matmul(tf.reduce_mean(e, axis=1), dense.kernel)[0, cls]
    grad = tape.gradient(logit, e)
    if norm:
        return np.linalg.norm(grad.numpy()[0], axis=-1), float(logit)
    return (grad * e).numpy()[0].sum(-1), float(logit)


def test_token_scores_match_the_tape_and_add_up_to_the_logit(text_model):
    model = keras.models.load_model(text_model)
    ids = np.array([2, 3, 4, 5, 6, 9, 0, 0])
    ex = gs.explain(text_model, ids, target=1, method="gradient_x_input")
    ref, logit = tape_token_scores(model, ids, 1)
    assert ex.node == "embed" and ex.saliency.shape == (LENGTH,) and ex.labels == tuple(map(str, ids))
    np.testing.assert_allclose(ex.saliency, ref, rtol=1e-4, atol=1e-7)
    assert ex.saliency.sum() == pytest.approx(logit, rel=1e-4, abs=1e-6)  # linear, no bias: complete
    # under LRP the signal at the embedding is relevance, summed as it is: on a bias-free linear net LRP-0 with
    # the one-hot seed is gradient x input divided by the logit (RULES_SPEC §2.5), and it sums to 1
    lrp = gs.explain(text_model, ids, target=1, method="lrp_epsilon", method_options={"epsilon": 1e-9})
    # (atol: the pool's 1e-6 Norm stabiliser against means of about 1e-2)
    np.testing.assert_allclose(lrp.saliency, ref / logit, rtol=1e-3, atol=2e-4)
    assert lrp.saliency.sum() == pytest.approx(1.0, abs=1e-3)


def test_the_gradient_of_a_token_is_the_norm_of_its_embeddings_gradient_and_the_sidecar_says_so(text_model, tmp_path):
    """Issue 63: ``gradient`` on tokens is the L2 norm of the gradient at each token's embedding, so it is not
    ``gradient_x_input``; the sidecar says how each was read."""
    model = keras.models.load_model(text_model)
    ids = np.array([2, 3, 4, 5, 6, 9, 0, 0])
    norm, _ = tape_token_scores(model, ids, 1, norm=True)
    times, _ = tape_token_scores(model, ids, 1)
    grad = gs.explain(text_model, ids, target=1, method="gradient")
    gxi = gs.explain(text_model, ids, target=1, method="gradient_x_input")
    np.testing.assert_allclose(grad.saliency, norm, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(gxi.saliency, times, rtol=1e-4, atol=1e-7)
    assert not np.allclose(grad.saliency, gxi.saliency)
    sides = [
        json.loads(e.save(tmp_path / f"{e.method.name}.png").with_suffix(".json").read_text()) for e in [grad, gxi]
    ]
    assert "L2 norm" in sides[0]["token_score"] and "times each token's embedding" in sides[1]["token_score"]


def test_words_through_a_vocabulary_are_padded_and_exported_with_their_scores(text_model, vocab_file, tmp_path):
    from gradscope.io.model_inputs import text_input
    from gradscope.io.sequences import Vocabulary

    engine = gs.open_engine(text_model)
    fed = text_input(engine.graph, "The movie was great!", Vocabulary.load(vocab_file))
    assert fed.ids.tolist() == [2, 3, 4, 5, 6, 0, 0, 0] and "Padded 3 position(s)" in fed.note
    ex = gs.explain(engine, fed)
    assert ex.labels[:5] == ("the", "movie", "was", "great", "!")
    png = ex.save(tmp_path / "t.png")
    side = json.loads(png.with_suffix(".json").read_text())
    assert [p["label"] for p in side["positions"][:2]] == ["the", "movie"] and side["positions"][0]["id"] == 2
    np.testing.assert_allclose([p["score"] for p in side["positions"]], ex.saliency, rtol=1e-6)
    assert side["export"]["scores_csv"] == "t_scores.csv" and side["view"]["normalization"] == "signed"
    rows = (tmp_path / "t_scores.csv").read_text().splitlines()
    assert rows[0] == "index,label,id,score" and rows[1].startswith("0,the,2,")
    from gradscope.app.files.exports import read_sidecar

    assert read_sidecar(png)["positions"][3]["label"] == "great"  # the schema reads it back


def test_a_tabular_row_gets_one_score_per_feature(tmp_path):
    keras.utils.set_random_seed(4)
    i = keras.Input((3,), name="x")
    o = keras.layers.Dense(2, use_bias=False, name="out")(i)
    model = keras.Model(i, o)
    (tmp_path / "rows.csv").write_text("age,income,debt\n1,2,3\n0.5,-1,4\n")
    ex = gs.explain(model, tmp_path / "rows.csv", row=1, target=0, method="gradient_x_input")
    w = model.get_layer("out").kernel.numpy()[:, 0]
    x = np.array([0.5, -1.0, 4.0], np.float32)
    np.testing.assert_allclose(ex.saliency, w * x, rtol=1e-5)
    assert ex.labels == ("age", "income", "debt") and ex.render().ndim == 3
    with pytest.raises(InputError, match="takes 3 features; the row has 2"):
        (tmp_path / "short.csv").write_text("1,2\n")
        gs.explain(model, tmp_path / "short.csv")


def test_the_cli_explains_typed_text_and_says_what_is_wrong_in_one_line(text_model, vocab_file, tmp_path, capsys):
    out = tmp_path / "words.png"
    argv = ["explain", str(text_model), "--text", "the movie was great", "--vocab", str(vocab_file), "--out", str(out)]
    assert main(argv) == 0
    side = json.loads(out.with_suffix(".json").read_text())
    assert [p["label"] for p in side["positions"][:4]] == ["the", "movie", "was", "great"]
    assert side["readout_node"] == "embed" and (tmp_path / "words_scores.csv").is_file()
    capsys.readouterr()
    for bad, message in (
        (["--tokens", "2 3 99 0 0 0 0 0"], "Token 2 of input 'tokens' is id 99, outside the embedding's vocabulary"),
        (["--tokens", "2 3"], "Input 'tokens' takes 8 token ids; got 2 (with no vocabulary, id 0 is not known"),
        (["--text", "the movie"], "--text needs a vocabulary to turn words into token ids: --vocab FILE"),
        (["--tokens", "2 x"], "Token 1 'x' is not a token id"),
    ):
        assert main(["explain", str(text_model), *bad, "--out", str(tmp_path / "bad.png")]) == EXIT_USER_ERROR
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_a_vocabulary_beside_the_model_is_read_by_the_cli_and_the_api(text_model, vocab_file, tmp_path, capsys):
    """As the window does (README: words typed for a model with its vocab.txt beside it)."""
    import shutil

    folder = tmp_path / "model"
    folder.mkdir()
    model = folder / "clf.keras"
    shutil.copy(text_model, model)
    shutil.copy(vocab_file, folder / "clf.vocab.txt")
    out = tmp_path / "words.png"
    assert main(["explain", str(model), "--text", "the movie was great", "--out", str(out)]) == 0
    side = json.loads(out.with_suffix(".json").read_text())
    assert [p["label"] for p in side["positions"][:4]] == ["the", "movie", "was", "great"]
    e = gs.explain(str(model), "the movie was great")
    assert e.labels[:4] == ("the", "movie", "was", "great")
    assert np.allclose(e.saliency[:4], [p["score"] for p in side["positions"][:4]], rtol=1e-4, atol=1e-7)


def test_the_session_shows_and_exports_the_same_token_scores_as_the_api(text_model, vocab_file, tmp_path):
    """The GUI's Session: typed words through a vocabulary found beside the model, the token strip, and an
    export whose sidecar holds the scores the API computes."""
    import shutil

    from gradscope.app.session import Session
    from gradscope.app.work.worker import InlineExecutor

    model = tmp_path / "clf.keras"
    shutil.copy(text_model, model)
    shutil.copy(vocab_file, tmp_path / "clf.vocab.txt")  # found beside the model: data, read without asking
    s = Session(InlineExecutor())
    said: list[str] = []
    s.feedback.status_changed.connect(said.append)
    s.open_model(model)
    assert s.fed.vocab is not None and any("shown as words from clf.vocab.txt" in m for m in said)
    assert s.fed.labels and s.readout == "embed" and is_signed(s.view.normalization)  # random ids, signed map
    s.fed.set_typed("the movie was great")
    shown = s.overlay()
    api = gs.explain(text_model, s.fed.fed.ids, target=s.result.target_indices[0].item())
    assert shown.saliency.shape == (LENGTH,) and shown.heat.ndim == 3
    np.testing.assert_allclose(shown.saliency, api.saliency, rtol=1e-5, atol=1e-8)
    s.editor.apply_method("lrp_epsilon")
    lrp = gs.explain(text_model, s.fed.fed.ids, target=s.result.target_indices[0].item(), method="lrp_epsilon")
    np.testing.assert_allclose(s.overlay().saliency, lrp.saliency, rtol=1e-5, atol=1e-8)
    png = s.exports.overlay(tmp_path / "shown.png")
    side = json.loads(png.with_suffix(".json").read_text())
    assert [p["label"] for p in side["positions"][:4]] == ["the", "movie", "was", "great"]
    assert side["image"] == "<typed: the movie was great>" and (tmp_path / "shown_scores.csv").is_file()
    np.testing.assert_allclose([p["score"] for p in side["positions"]], lrp.saliency, rtol=1e-5, atol=1e-8)
    errors: list[str] = []
    s.feedback.error_raised.connect(lambda title, message, exc: errors.append(message))
    ids = s.fed.fed.ids.copy()
    assert not s.fed.set_typed("2 3 99")  # an id the embedding lacks: told, and the last good input stays
    assert "Token 2 of input 'tokens' is id 99" in errors[-1] and "unchanged" in errors[-1]
    assert s.fed.typed == "the movie was great" and np.array_equal(s.fed.fed.ids, ids)
    assert not s.fed.set_typed(" ".join(["movie"] * (LENGTH + 1)))  # too long: refused the same way
    assert s.fed.typed == "the movie was great" and len(errors) == 2


def test_a_session_file_keeps_typed_tokens_and_their_vocabulary(text_model, vocab_file, tmp_path):
    from gradscope.app.files.session_files import read_session_file
    from gradscope.app.session import Session
    from gradscope.app.work.worker import InlineExecutor

    s = Session(InlineExecutor())
    s.open_model(text_model)
    s.fed.set_vocabulary(vocab_file)
    s.fed.set_typed("the movie was great")
    saved = s.save(tmp_path / "words")
    data = read_session_file(saved)
    assert data["schema"] == 3 and data["tokens"] == "the movie was great" and data["vocabulary"] == str(vocab_file)
    t = Session(InlineExecutor())
    assert t.load(saved)
    assert t.fed.typed == "the movie was great" and t.fed.labels[:4] == ("the", "movie", "was", "great")
    np.testing.assert_allclose(t.overlay().saliency, s.overlay().saliency, rtol=1e-6)


def test_a_schema_2_session_keeps_its_ids(tmp_path):
    """Schema 3 only added tokens and the vocabulary: a schema-2 file's ids are today's (no schema-1 upgrade)."""
    from gradscope.app.session import Session
    from gradscope.app.work.worker import InlineExecutor
    from tests.engine.fixtures import tiny_cnn

    model = tmp_path / "tiny.keras"
    tiny_cnn().save(model)
    (tmp_path / "old.gradscope.json").write_text(json.dumps({"schema": 2, "model": str(model), "selected": "c1"}))
    s = Session(InlineExecutor())
    assert s.load(tmp_path / "old.gradscope.json")
    assert s.selected == "c1"  # schema 1 would have made it "c1:pre"
