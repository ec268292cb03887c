"""Checkpoint configs carried over as transformers runs them (issue 61): tiny folders written by transformers with one
field off its default (``tests/data/hf_variants``, ``scripts/hf_checkpoints.py --variants``), each either opening
with torch's float64 logits or refused in one line naming the field; a float32 checkpoint stays float32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import gradscope.api as gs
from gradscope.core.errors import ModelLoadError
from gradscope.io.checkpoints.faithful import Conversion

pytest.importorskip("keras_hub")

DATA = Path(__file__).resolve().parents[1] / "data"
VARIANTS = DATA / "hf_variants"
CARRIED = (
    "llama_rms_norm_eps",
    "gemma_rms_norm_eps",
    "gemma2_rms_norm_eps",
    "gemma3_rms_norm_eps",
    "gpt2_layer_norm_epsilon",
    "qwen2_moe_tie_word_embeddings",  # keras_hub's converter never reads it (and alone fails: no lm_head.weight)
    # read by keras_hub's converter; held here on 9 tokens through a window of 4, and Llama 3's rotary scaling
    "llama_rope_scaling",
    "mistral_sliding_window",
    "mixtral_sliding_window",
    "qwen3_moe_sliding_window",
    "qwen2_moe_norm_topk_prob",
)
REFUSED = {
    "llama_attention_bias": "attention_bias = True",
    "gemma2_query_pre_attn_scalar": "query_pre_attn_scalar = 256",
    "gemma3_query_pre_attn_scalar": "query_pre_attn_scalar = 256",
    "gpt2_activation_function": "activation_function = 'relu'",
}


def _logits(engine, ids: np.ndarray) -> np.ndarray:
    return np.asarray(engine.model({"token_ids": ids[None], "padding_mask": np.ones((1, len(ids)), "int32")}))[0]


@pytest.mark.parametrize("name", CARRIED)
def test_a_field_keras_hubs_converter_drops_is_carried_over(name):
    ref = np.load(VARIANTS / f"{name}.npz")
    engine = gs.open_engine(VARIANTS / name)
    logits = _logits(engine, ref["ids"])
    want = ref["logits"]
    np.testing.assert_allclose(logits, want, atol=1e-5 * np.abs(want).max(), rtol=0)


@pytest.mark.parametrize(
    "name",
    [
        "llama_rms_norm_eps",
        "gemma3_rms_norm_eps",
        "gpt2_layer_norm_epsilon",
        "mixtral_sliding_window",
        "qwen3_moe_sliding_window",
        "qwen2_moe_norm_topk_prob",
        "qwen2_moe_tie_word_embeddings",
    ],
)
def test_attnlrp_and_cp_lrp_on_a_carried_field_equal_lxt(name):
    """LXT 2.1's float64 relevance on the transformers model with that field (hf_checkpoints.py --variants --lxt;
    the mixtures of experts with their routers held constant, as tests/rules/test_lxt_reference.py; Qwen 2 MoE's
    shared expert's sigmoid gate held constant too, its attention through LXT's wrapped attention function)."""
    from gradscope.core.targets import Target

    ref, prompt = np.load(VARIANTS / f"{name}_lxt.npz"), np.load(VARIANTS / f"{name}.npz")
    engine = gs.open_engine(VARIANTS / name)
    for method in ("attnlrp", "cp_lrp"):
        target = Target(kind="token", index=int(ref["token"]))
        got = np.asarray(gs.explain(engine, prompt["ids"], method=method, target=target).saliency, float)
        want = ref[f"{method}_float64"]
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4, method


def test_without_the_carried_field_the_logits_would_differ():
    """The test above can fail: the Llama folder built with keras_hub's own epsilon is off torch's logits."""
    config = json.loads((VARIANTS / "llama_rms_norm_eps" / "config.json").read_text())
    conversion = Conversion("llama", config)
    assert conversion.arguments == {"layer_norm_epsilon": 1e-5}
    import keras_hub

    model = keras_hub.models.CausalLM.from_preset(str(VARIANTS / "llama_rms_norm_eps"), preprocessor=None)
    ref = np.load(VARIANTS / "llama_rms_norm_eps.npz")
    want = ref["logits"]
    assert np.abs(_logits(type("E", (), {"model": model}), ref["ids"]) - want).max() > 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_field_keras_hub_cannot_build_refuses_the_folder_in_one_line(name):
    with pytest.raises(ModelLoadError) as err:
        gs.open_engine(VARIANTS / name)
    message = str(err.value)
    assert "\n" not in message and REFUSED[name] in message and name in message and "keras_hub" in message


def test_rotary_scaling_written_as_newer_transformers_write_it_is_carried(tmp_path):
    """transformers 5 writes ``rope_parameters`` (the wavelength and the scaling together) where 4.x wrote
    ``rope_theta`` and ``rope_scaling``; keras_hub's Llama 3 converter reads the wavelength there, not the scaling
    (0.65 of the largest logit on this folder). The same folder in the newer form gives torch's logits."""
    folder = tmp_path / "llama_rope_parameters"
    shutil.copytree(VARIANTS / "llama_rope_scaling", folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {**config.pop("rope_scaling"), "rope_theta": config.pop("rope_theta")}
    (folder / "config.json").write_text(json.dumps(config))
    ref = np.load(VARIANTS / "llama_rope_scaling.npz")
    want = ref["logits"]
    logits = _logits(gs.open_engine(folder), ref["ids"])
    np.testing.assert_allclose(logits, want, atol=1e-5 * np.abs(want).max(), rtol=0)


@pytest.mark.parametrize(
    ("folder", "parameters", "named"),
    [
        ("hf/qwen2", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}, "rope_scaling = .*yarn"),
        (
            "hf/gemma3",
            {"full_attention": {"rope_type": "default", "rope_theta": 500000.0}, "sliding_attention": {}},
            "rope_parameters.full_attention = .*wavelengths of 1e",
        ),
        ("hf/gemma2", {"rope_type": "default", "rope_theta": 500000.0}, "rope_theta = 500000"),
    ],
)
def test_rotary_parameters_in_the_newer_form_are_checked_as_the_older(tmp_path, folder, parameters, named):
    copy = tmp_path / Path(folder).name
    shutil.copytree(DATA / folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config.pop("rope_theta", None)
    (copy / "config.json").write_text(json.dumps(config | {"rope_parameters": parameters}))
    with pytest.raises(ModelLoadError, match=named):
        gs.open_engine(copy)


def test_a_float32_mistral_stays_float32():
    """keras_hub's Mistral converter rounds every tensor to float16 before it assigns it (1.3e-3 of the largest logit
    off torch); gradscope keeps the checkpoint's precision."""
    ref = np.load(DATA / "hf" / "mistral.npz")
    engine = gs.open_engine(DATA / "hf" / "mistral")
    assert {v.dtype for v in engine.model.weights} == {"float32"}
    want = ref["logits"]
    np.testing.assert_allclose(_logits(engine, ref["ids"]), want, atol=1e-5 * np.abs(want).max(), rtol=0)


def test_an_unscaled_family_refuses_rope_scaling_and_a_gpt2_norm_epsilon_reaches_every_norm(tmp_path):
    folder = tmp_path / "qwen2_scaled"
    shutil.copytree(DATA / "hf" / "qwen2", folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"rope_scaling = .*yarn.*unscaled rotary positions"):
        gs.open_engine(folder)
    engine = gs.open_engine(VARIANTS / "gpt2_layer_norm_epsilon")
    import keras

    norms = [la for la in engine.model._flatten_layers() if isinstance(la, keras.layers.LayerNormalization)]
    assert norms and {la.epsilon for la in norms} == {1e-3}


@pytest.mark.parametrize(
    ("folder", "edit", "named"),
    [
        ("hf/qwen3", {"attention_bias": True}, "attention_bias = True"),
        ("hf/qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}, "max_window_layers"),
        ("hf/gemma", {"hidden_act": "gelu"}, "hidden_act = 'gelu'.*tanh approximation.*gelu_pytorch_tanh"),
        ("hf/gemma2", {"hidden_activation": "gelu"}, "hidden_activation = 'gelu'"),
        ("hf/gemma3", {"hidden_activation": "silu"}, "hidden_activation = 'silu'"),
        ("hf/llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling = .*llama3 rotary"),
        ("hf/smollm3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling = .*unscaled"),
        (
            "hf/smollm3",
            {"use_sliding_window": True, "sliding_window": 4, "layer_types": ["sliding_attention"] * 2},
            "use_sliding_window = True.*full attention",
        ),
        ("hf/mistral", {"tie_word_embeddings": True}, "tie_word_embeddings = True.*lm_head"),
        ("hf/mixtral", {"head_dim": 16}, "head_dim = 16"),
        ("hf/qwen3_moe", {"mlp_only_layers": [0]}, r"mlp_only_layers = \[0\]"),
        ("hf/qwen3_moe", {"sliding_window": 4, "layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ("hf_variants/qwen2_moe_norm_topk_prob", {"qkv_bias": False}, "qkv_bias = False"),
        ("hf_variants/qwen2_moe_norm_topk_prob", {"mlp_only_layers": [1]}, "mlp_only_layers"),
        ("hf/llama", {"model_type": "gpt_oss"}, "model_type is 'gpt_oss', which keras_hub converts but gradscope"),
        ("hf/llama", {"model_type": "bert"}, "model_type is 'bert'.*folders that open: llama, mistral"),
    ],
)
def test_what_a_family_cannot_build_is_named_before_any_weight_is_read(tmp_path, folder, edit, named):
    copy = tmp_path / Path(folder).name
    shutil.copytree(DATA / folder, copy)
    config = json.loads((copy / "config.json").read_text())
    if "layer_types" not in edit:
        config.pop("layer_types", None)  # transformers derives it from the fields edited here
    (copy / "config.json").write_text(json.dumps(config | edit))
    (copy / "model.safetensors").write_bytes(b"")  # nothing is read: the refusal comes from the config alone
    with pytest.raises(ModelLoadError, match=named) as err:
        gs.open_engine(copy)
    assert "\n" not in str(err.value)


def test_a_refusal_quotes_the_users_config_shortened_and_on_one_line(tmp_path):
    folder = tmp_path / "gemma2"
    shutil.copytree(DATA / "hf" / "gemma2", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"layer_types": ["sliding_attention\n"] * 5000}))
    with pytest.raises(ModelLoadError, match="layer_types = ") as err:
        gs.open_engine(folder)
    assert "\n" not in str(err.value) and len(str(err.value)) < 600
