"""keras_hub (issue 23): its tokenizer as the vocabulary of a text model (text split as the model was trained,
wrapped in BERT's [CLS] ... [SEP], fed with its padding mask and segment ids, explained per token), its BERT and
ViT backbones opened with their transformer blocks as layers, and a clear line where keras_hub is missing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradscope.core.errors import InputError
from gradscope.io.sequences import HubVocabulary, Vocabulary

keras_hub = pytest.importorskip("keras_hub")
keras = pytest.importorskip("keras")

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s", "on", "mat", "dog"]


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert_preset")
    keras_hub.tokenizers.BertTokenizer(vocabulary=WORDS, lowercase=True).save_to_preset(str(folder))
    return folder


def test_a_keras_hub_preset_folder_is_a_vocabulary_that_splits_words_as_the_model_was_trained(preset):
    for path in (preset, preset / "tokenizer.json"):
        vocab = Vocabulary.load(path)
        assert isinstance(vocab, HubVocabulary) and vocab.tokens == tuple(WORDS)
        ids = vocab.encode("The cats sat on the mat")
        reference = keras_hub.tokenizers.BertTokenizer(vocabulary=WORDS, lowercase=True).tokenize(
            "The cats sat on the mat"
        )
        np.testing.assert_array_equal(ids, [2, *np.asarray(reference).tolist(), 3])  # [CLS] ... [SEP]
        assert vocab.decode(ids) == ["[CLS]", "the", "cat", "##s", "sat", "on", "the", "mat", "[SEP]"]
        assert vocab.encode("the zebra").tolist() == [2, 5, 1, 3]  # an unknown word: the tokenizer's [UNK]


def test_only_keras_hub_classes_are_loaded_from_a_tokenizer_file(tmp_path, preset):
    config = json.loads((preset / "tokenizer.json").read_text())
    config["module"] = "os"
    (tmp_path / "tokenizer.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="not a keras_hub tokenizer"):
        Vocabulary.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        Vocabulary.load(tmp_path)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """keras_hub's BertBackbone (2 blocks, width 16) with a classification head, saved as a user saves it."""
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(WORDS),
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=12,
    )
    head = keras.layers.Dense(2, name="head")(backbone.output["pooled_output"])
    path = tmp_path_factory.mktemp("bert") / "bert.keras"
    keras.Model(backbone.input, head).save(path)
    return path


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_typed_text_explains_a_keras_hub_bert_per_word(bert, preset, method):
    import gradscope.api as gs
    from gradscope.io.models import load_model

    ex = gs.explain(bert, "The cats sat on the mat", vocab=preset, method=method, target=1)
    assert ex.labels[:9] == ("[CLS]", "the", "cat", "##s", "sat", "on", "the", "mat", "[SEP]")
    assert ex.node == "token_embedding" and np.isfinite(ex.saliency).all() and not ex.warnings
    assert {"transformer_layer_0/self_attention_layer", "transformer_layer_1/feedforward_layer_norm"} <= set(
        ex.result.rules
    )
    model = load_model(bert)  # the engine ran the model keras_hub built, with the mask made from the text
    ids = ex.fed.ids[None]  # the backbone takes any length: no padding
    assert ids.shape == (1, 9)
    feed = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": np.ones_like(ids)}
    np.testing.assert_allclose(ex.result.logits, model(feed).numpy(), rtol=1e-5, atol=1e-6)


def test_the_window_loads_a_tokenizer_on_the_worker_and_the_typed_text_waits_for_it(bert, preset):
    """keras_hub imports TensorFlow, which only the worker may do (two threads importing it break it); a new
    model does not cancel the tokenizer's load, and the text typed meanwhile is read with it."""
    from gradscope.app.session import Session
    from tests.app.test_session import ManualExecutor

    executor = ManualExecutor()
    s = Session(executor)
    said: list[str] = []
    s.feedback.error_raised.connect(lambda title, message, *rest: said.append(f"{title}: {message}"))
    assert s.fed.set_vocabulary(preset) and s.fed.loading_vocab and s.fed.vocab is None
    s.fed.set_typed("The cats sat")
    s.document.open(bert)  # a new model: the tokenizer's job is not made pointless
    assert [job.kind for job in executor.jobs] == ["vocab", "load"]
    executor.run_all()
    assert not s.fed.loading_vocab and isinstance(s.fed.vocab, HubVocabulary)
    executor.run_all()
    assert s.fed.labels[:5] == ("[CLS]", "the", "cat", "##s", "sat") and not said


def test_words_typed_while_the_open_models_tokenizer_loads_wait_for_it(bert, preset):
    """The window opens a folder's model first and then its tokenizer: words typed in between are not refused as
    token ids; they are read with the tokenizer once it is there."""
    from gradscope.app.session import Session
    from tests.app.test_session import ManualExecutor

    executor = ManualExecutor()
    s = Session(executor)
    said: list[str] = []
    s.feedback.error_raised.connect(lambda title, message, *rest: said.append(f"{title}: {message}"))
    s.document.open(bert)
    executor.run_all()
    assert s.graph is not None and s.fed.vocab is None
    assert s.fed.set_vocabulary(preset) and s.fed.loading_vocab
    assert s.fed.set_typed("The cats sat") and s.fed.typed == "The cats sat"
    executor.run_all()
    executor.run_all()
    assert s.fed.labels[:5] == ("[CLS]", "the", "cat", "##s", "sat") and not said


def _loaded_without(module: str, path: object):
    """``load_model(path)`` in a fresh process where ``module`` cannot be imported; ``ERROR <message>`` on stdout."""
    import subprocess
    import sys

    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from gradscope.core.errors import GradscopeError\n"
        "from gradscope.io.models import load_model\n"
        "try:\n    load_model(sys.argv[1])\nexcept GradscopeError as exc:\n    print('ERROR', exc)\n"
    )
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)


def test_a_keras_hub_model_where_keras_hub_is_missing_says_to_install_it(bert):
    """In a fresh process where keras_hub cannot be imported (its classes are then neither registered nor
    importable): one line saying what to install, not "a custom layer is missing"."""
    out = _loaded_without("keras_hub", bert)
    assert (
        "ERROR" in out.stdout and "built from keras_hub's" in out.stdout and "pip install 'gradscope[hf]'" in out.stdout
    )


def test_a_keras_hub_vit_opens_its_blocks_and_keeps_its_true_gradient():
    """ViTBackbone in memory (keras_hub 0.32 cannot reload its own saved ViT: ViTPatchingAndEmbedding's config
    has arguments its constructor refuses). The patch embedding cannot run on symbolic inputs: one exact node,
    noted; the encoder's blocks open, and AttnLRP reaches their attention."""
    from gradscope.backend import tf
    from gradscope.core.targets import Target
    from gradscope.engine.backward.runner import Engine
    from gradscope.rules.methods import build_method
    from gradscope.rules.plan import Plan

    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32
    )
    model = keras.Model(backbone.input, keras.layers.Dense(3, name="head")(backbone.output[:, 0]))
    engine = Engine(model, strip_softmax=False)
    assert "vit_encoder/transformer_block_1/mha" in engine.graph
    assert any("vit_patching_and_embedding" in note for note in engine.graph.notes)
    x = np.random.default_rng(2).uniform(0, 1, (1, 32, 32, 3)).astype("float32")
    got = engine.backward(x, Target(index=2), Plan()).input_grads[0]
    t = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(t)
        score = tf.reduce_sum(model(t)[:, 2])
    np.testing.assert_allclose(got, tape.gradient(score, t).numpy(), rtol=1e-4, atol=1e-6)
    rules = engine.backward(x, Target(index=2), build_method("attnlrp", engine.graph).plan).rules
    assert rules["vit_encoder/transformer_block_2/mha"] == "attention_lrp"


def test_a_tokenizer_that_fails_to_load_lets_the_typed_input_go_on(tmp_path, bert, preset):
    from gradscope.app.session import Session
    from tests.app.test_session import ManualExecutor

    config = json.loads((preset / "tokenizer.json").read_text())
    config["module"] = "os"
    (tmp_path / "tokenizer.json").write_text(json.dumps(config))
    executor = ManualExecutor()
    s = Session(executor)
    said: list[str] = []
    s.feedback.error_raised.connect(lambda title, message, *rest: said.append(title))
    s.document.open(bert)
    executor.run_all()
    assert s.fed.set_vocabulary(tmp_path) and s.fed.loading_vocab
    s.fed.set_typed("2 5 9")  # waits for the tokenizer
    executor.run_all()
    assert not s.fed.loading_vocab and s.fed.vocab is None and said == ["Cannot read the vocabulary"]
    assert s.fed.fed is not None and s.fed.fed.ids.tolist()[:3] == [2, 5, 9]  # the ids went on, shown as ids


def test_a_checkpoint_folder_where_keras_hub_cannot_import_names_the_module_and_the_one_fix():
    """keras-hub installed with --no-deps fails on ``regex``: the message named keras_hub and a command that did not
    help; it names the missing module and the extra that brings everything."""
    from pathlib import Path

    out = _loaded_without("regex", Path(__file__).resolve().parent / "data" / "hf" / "gpt2")
    assert "ERROR" in out.stdout and "Hugging Face checkpoint folder" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "'regex'" in out.stdout and "pip install 'gradscope[hf]'" in out.stdout


def test_a_bert_classifiers_text_evaluation_is_its_keras_model_with_token_embeddings_replaced(bert, preset, tmp_path):
    """Issue 63 on a BERT-style classifier (a .keras file, keras_hub's tokenizer): each MoRF point is the Keras
    model with its token embedding's output at the removed positions replaced by the [MASK] token's, by hand."""
    import json

    import gradscope as gs
    from gradscope.engine.evaluation import token_metrics as tm
    from gradscope.io.model_inputs import text_input

    (tmp_path / "texts.jsonl").write_text(
        json.dumps({"text": "The cats sat on the mat"}) + "\n" + json.dumps({"text": "the dog sat", "target": 0}) + "\n"
    )
    out = tmp_path / "run"
    report = gs.evaluate(bert, tmp_path / "texts.jsonl", methods="attnlrp,gradient_x_input", vocab=preset,
                         baseline="mask", out=out)  # fmt: skip
    assert report.images == 2 and not report.bad
    engine = gs.open_engine(bert)
    model, layer = engine.model, engine.model.get_layer("token_embedding")
    vocab = Vocabulary.load(preset)
    records = [r for p in sorted((out / "batches").glob("*.json")) for r in json.loads(p.read_text())["images"]]
    for rec, text in zip(records, ["The cats sat on the mat", "the dog sat"]):
        fed = text_input(engine.graph, text, vocab)
        n = rec["length"]
        assert rec["tokens"] == list(vocab.decode(fed.ids[:n])) and rec["tokens"][0] == "[CLS]"
        feed = dict(zip(engine.graph.input_ids, fed.arrays))
        mask_row = layer(np.array([[WORDS.index("[MASK]")]]))[0, 0]
        order = tm.token_order(np.asarray(rec["scores"]["attnlrp"]["map"]))
        for k in (0, 2, n):
            removed = np.zeros(fed.ids.shape[0], bool)
            removed[order[:k]] = True
            original = layer.call

            def call(inputs, *args, _original=original, _removed=removed, _row=mask_row, **kwargs):
                y = _original(inputs, *args, **kwargs)
                return keras.ops.where(_removed[None, :, None], _row, y)

            layer.call = call
            try:
                want = float(model(feed)[0, rec["class"]])
            finally:
                del layer.call
            assert rec["scores"]["attnlrp"]["morf"][k] == pytest.approx(want, rel=1e-4, abs=1e-5)
