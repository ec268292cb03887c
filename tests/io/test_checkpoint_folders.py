"""Checkpoint folders as users have them (issue 50): Hugging Face folders written by ``save_pretrained`` in a torch
venv (``tests/data/hf``, made by ``scripts/hf_checkpoints.py``; torch is not needed here) and a keras_hub preset
folder open wherever a model file does, through keras_hub's own converters; their tokenizer is the vocabulary;
nothing is downloaded and nothing in a folder runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import gradscope.api as gs
from gradscope.app.files.session_files import find_vocabulary
from gradscope.cli import main
from gradscope.core.errors import ModelLoadError
from gradscope.io.sequences import Vocabulary

pytest.importorskip("keras_hub")
pytest.importorskip("safetensors")

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"
FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3",
    "gpt2",
    "smollm3",
)
MIXTURES = ("mixtral", "qwen3_moe")
#: Every family within 1e-6 of the largest logit of torch's float64 since issue 61 (keras_hub's Mistral converter
#: rounded to float16: 1.3e-3; Qwen 3's query/key norms were built with 1e-5 for the config's 1e-6: 2.5e-5).
TOLERANCE: dict[str, float] = {}


def _feed(ids: np.ndarray) -> dict:
    return {"token_ids": ids[None], "padding_mask": np.ones((1, len(ids)), "int32")}


@pytest.fixture(scope="module")
def engines():
    return {family: gs.open_engine(DATA / family) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_hugging_face_folder_opens_with_the_logits_torch_computes(engines, family):
    ref = np.load(DATA / f"{family}.npz")
    logits = np.asarray(engines[family].model(_feed(ref["ids"])))[0]
    want = ref["logits"]
    assert logits.shape == want.shape
    np.testing.assert_allclose(logits, want, atol=TOLERANCE.get(family, 1e-6) * np.abs(want).max(), rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_its_next_token_is_explained_by_attnlrp(engines, family):
    ref = np.load(DATA / f"{family}.npz")
    ex = gs.explain(engines[family], ref["ids"], method="attnlrp")
    assert ex.node.endswith("token_embedding") and ex.saliency.shape == (len(ref["ids"]),)
    assert np.isfinite(ex.saliency).all() and np.abs(ex.saliency).max() > 0
    assert "attention_lrp" in ex.result.rules.values() and not ex.warnings
    assert ("experts_lrp" in ex.result.rules.values()) == (family in MIXTURES)  # routers held constant
    assert ex.predicted_class == int(np.argmax(ref["logits"][-1]))  # the most likely next token, as torch says


@pytest.mark.parametrize("family", MIXTURES)
def test_a_mixture_of_experts_is_one_node_whose_identity_plan_is_the_tapes_gradient(engines, family):
    """Its call reshapes by the batch and length it reads at run time: opened symbolically it failed (issue 50)."""
    from gradscope.core.targets import Target
    from tests.engine.backward.language_models import tape_embedding_gradient

    engine, ids = engines[family], np.load(DATA / f"{family}.npz")["ids"]
    assert [n.op_type for n in engine.graph.nodes if n.op_type.endswith("MoeBlock")] and not engine.graph.notes
    token = int(np.load(DATA / f"{family}.npz")["logits"][-1].argmax())
    want = np.asarray(tape_embedding_gradient(engine.model, _feed(ids), len(ids) - 1, token))[0]
    node = engine.graph.embedding_of(engine.graph.token_input).id
    arrays = list(gs.model_input(engine, ids).arrays)
    got = engine.backward(arrays, Target(kind="token", index=token), None, capture=[node], stats=False)
    np.testing.assert_allclose(got.node_grads[node][0], want, atol=1e-5 * np.abs(want).max(), rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_the_folders_tokenizer_is_the_vocabulary_and_splits_text_as_transformers(family):
    assert find_vocabulary(DATA / family) == DATA / family
    vocab = Vocabulary.load(DATA / family)
    ids = np.asarray(vocab.tokenizer.tokenize("the cat sat on the mat")).reshape(-1)
    np.testing.assert_array_equal(ids, np.load(DATA / f"{family}.npz")["text_ids"])
    assert find_vocabulary(DATA / "mistral") is None  # no tokenizer in that folder: token ids only


def test_the_cli_explains_a_folder_by_its_text_and_names_the_folder(tmp_path, capsys):
    out = tmp_path / "o.png"
    args = ["explain", str(DATA / "llama"), "--text", "the cat sat on the", "--method", "attnlrp", "--out", str(out)]
    assert main(args) == 0
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["model_file"] == str(DATA / "llama") and side["method"] == "attnlrp"
    assert [p["label"] for p in side["positions"]][0] == "<|begin_of_text|>"  # as Llama 3's preprocessor starts


def test_a_keras_hub_preset_folder_opens_too(tmp_path):
    from tests.engine.backward.language_models import feed, tiny_causal_lm

    lm = tiny_causal_lm("gpt2")
    lm.save_to_preset(str(tmp_path / "preset"))
    ids = np.array([3, 9, 4, 17])
    engine = gs.open_engine(tmp_path / "preset")
    np.testing.assert_allclose(np.asarray(engine.model(feed(ids))), np.asarray(lm(feed(ids))), rtol=1e-6, atol=1e-6)


def test_downloads_code_and_folders_that_are_no_checkpoint_are_refused_in_one_line(tmp_path):
    for handle in ("hf://meta-llama/Llama-3.2-1B", "kaggle://keras/llama3/keras/llama3_8b_en", "https://x.org/m"):
        with pytest.raises(ModelLoadError, match="never downloads"):
            gs.open_engine(handle)
    remote = tmp_path / "remote"
    shutil.copytree(DATA / "mistral", remote)
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "modeling_x.XModel"}}))
    with pytest.raises(ModelLoadError, match="never runs a checkpoint's code"):
        gs.open_engine(remote)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps(config))
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(ModelLoadError, match="PyTorch pickles"):
        gs.open_engine(pickled)
    falcon = tmp_path / "falcon"
    shutil.copytree(DATA / "mistral", falcon)
    (falcon / "config.json").write_text(json.dumps({**config, "model_type": "falcon"}))
    with pytest.raises(ModelLoadError, match="no converter for Hugging Face model type 'falcon'.*llama, mistral"):
        gs.open_engine(falcon)
    with pytest.raises(ModelLoadError, match="not a checkpoint folder"):
        gs.open_engine(tmp_path)


def test_a_checkpoint_whose_own_output_layer_keras_hub_would_drop_is_refused(tmp_path):
    """keras_hub 0.32's SmolLM3 reads its logits from the token embedding: an untied checkpoint's lm_head was
    dropped without a word and every logit was wrong (found by this issue's tiny SmolLM3, first made untied)."""
    untied = tmp_path / "smollm3"
    shutil.copytree(DATA / "smollm3", untied)
    config = json.loads((untied / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with pytest.raises(ModelLoadError, match="own output layer.*would drop it"):
        gs.open_engine(untied)
