"""Tiny random-weight causal language models of every keras_hub family gradscope opens (built here, nothing
downloaded), and the tape reference at their token embedding."""

from __future__ import annotations

import numpy as np

V = 64  # vocabulary
FAMILIES = ("llama", "llama3", "mistral", "qwen", "gemma", "gemma2", "gemma3", "gpt2", "phi3")


def tiny_causal_lm(family: str, seed: int = 0):
    """A two-block causal LM of ``family`` (width 16, 4 query heads, 2 key/value heads where the family has
    grouped heads), its head included; sliding windows and soft-capping where the family has them."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    gqa = dict(num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=16, intermediate_dim=32)
    models = keras_hub.models
    if family in ("llama", "llama3", "mistral", "qwen", "phi3"):
        backbone_class, lm = {
            "llama": (models.LlamaBackbone, models.LlamaCausalLM),
            "llama3": (models.Llama3Backbone, models.Llama3CausalLM),
            "mistral": (models.MistralBackbone, models.MistralCausalLM),
            "qwen": (models.QwenBackbone, models.QwenCausalLM),
            "phi3": (models.Phi3Backbone, models.Phi3CausalLM),
        }[family]
        extra = {"sliding_window": 4} if family == "mistral" else {}
        backbone = backbone_class(vocabulary_size=V, **gqa, **extra)
    elif family in ("gemma", "gemma2"):
        lm = models.GemmaCausalLM
        extra = {}
        if family == "gemma2":
            extra = dict(
                query_head_dim_normalize=True,
                use_post_ffw_norm=True,
                use_post_attention_norm=True,
                final_logit_soft_cap=30.0,
                attention_logit_soft_cap=50.0,
                sliding_window_size=4,
                use_sliding_window_attention=True,
            )
        backbone = models.GemmaBackbone(
            vocabulary_size=V,
            num_layers=2,
            num_query_heads=4,
            num_key_value_heads=2,
            hidden_dim=16,
            intermediate_dim=64,
            head_dim=4,
            **extra,
        )
    elif family == "gemma3":
        lm = models.Gemma3CausalLM
        backbone = models.Gemma3Backbone(
            vocabulary_size=V,
            image_size=16,
            vision_encoder=None,
            head_dim=4,
            sliding_window_size=4,
            use_query_key_norm=True,
            **gqa,
        )
    else:
        lm = models.GPT2CausalLM
        backbone = models.GPT2Backbone(
            vocabulary_size=V, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, max_sequence_length=32
        )
    return lm(backbone=backbone, preprocessor=None)


def feed(ids, padding=None) -> dict:
    ids = np.asarray(ids)[None]
    mask = np.ones_like(ids, dtype="int32") if padding is None else np.asarray(padding, "int32")[None]
    return {"token_ids": ids, "padding_mask": mask}


def tape_embedding_gradient(model, inputs: dict, position: int, token: int) -> np.ndarray:
    """d logit[position, token] / d (token embedding output), by a plain GradientTape on the Keras model: the
    embedding layer's output is watched as it is made."""
    import tensorflow as tf

    layer = model.backbone.get_layer("token_embedding")
    made: dict = {}
    method = "quantized_call" if layer.quantization_mode else "call"  # what Keras runs for a quantized layer
    original = getattr(layer, method)

    with tf.GradientTape() as tape:

        def call(*args, **kwargs):
            out = original(*args, **kwargs)
            if not kwargs.get("reverse") and "e" not in made:
                tape.watch(out)
                made["e"] = out
            return out

        object.__setattr__(layer, method, call)
        try:
            score = model(inputs)[0, position, token]
        finally:
            object.__delattr__(layer, method)
    return tape.gradient(score, made["e"]).numpy()
