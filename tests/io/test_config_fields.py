"""Every field of a checked family's config is accounted for (issue 61): read by keras_hub's converter, carried over or
refused by gradscope (``gradscope/io/checkpoints/faithful.py``), or named here as not part of a forward pass.

The fields are transformers 4.53.3's own (``tests/data/hf_variants/config_fields.json``, written by
``scripts/hf_checkpoints.py --fields`` in the torch venv): each family's config class as it writes a config.json.
Which fields are read is observed, not listed: the config is handed to keras_hub's converter and to gradscope's
``Conversion`` as a dict that records every key looked up. A field transformers adds (a newer config_fields.json)
fails here until someone decides what it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradscope.io.checkpoints.faithful import CHECKED_TYPES, Conversion

pytest.importorskip("keras_hub")

DATA = Path(__file__).resolve().parents[1] / "data"
FIELDS = json.loads((DATA / "hf_variants" / "config_fields.json").read_text())

#: Fields that change no logit of a causal LM's forward pass, and why.
NOT_IN_THE_FORWARD = {
    "attention_dropout": "dropout: training only",
    "attn_pdrop": "dropout: training only",
    "embd_pdrop": "dropout: training only",
    "resid_pdrop": "dropout: training only",
    "router_jitter_noise": "router noise: training only",
    "router_aux_loss_coef": "a loss term: training only",
    "output_router_logits": "an extra output, not a change to the logits",
    "initializer_range": "random initialisation: the checkpoint's weights replace it",
    "use_cache": "decoding's key/value cache: the same values",
    "max_position_embeddings": "a length limit; rotary positions are computed from the position itself (rotary types "
    "that read it, dynamic and yarn, are refused)",
    "pretraining_tp": "Llama's projections computed in slices: the same product",
    "summary_type": "GPT-2's sequence-classification head, not in a causal LM",
    "summary_use_proj": "GPT-2's sequence-classification head",
    "summary_activation": "GPT-2's sequence-classification head",
    "summary_first_dropout": "GPT-2's sequence-classification head",
    "summary_proj_to_labels": "GPT-2's sequence-classification head",
    "reorder_and_upcast_attn": "GPT-2's attention scores in float32 under float16 autocast: precision, not arithmetic",
}
#: Fields transformers writes beside the one it runs: derived (into a field that is read) or legacy.
DERIVED = {
    ("qwen2", "max_window_layers"): "layer_types (read) is derived from it",
    ("qwen2_moe", "max_window_layers"): "read where layer_types is absent; its layers are checked either way",
    ("qwen3", "max_window_layers"): "layer_types (read) is derived from it",
    ("gemma3_text", "_sliding_window_pattern"): "layer_types (read) is derived from it",
    ("smollm3", "no_rope_layer_interval"): "no_rope_layers (read) is derived from it",
    ("gemma", "hidden_activation"): "transformers 4.53's Gemma runs hidden_act (read); this one is legacy",
}


class _Recording(dict):
    def __init__(self, config: dict, seen: set) -> None:
        super().__init__(config)
        self.seen = seen

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


def _read_by(family: str, config: dict) -> tuple[set, set]:
    from keras_hub.src.utils.transformers.preset_loader import TransformersPresetLoader

    keras_hub_reads, gradscope_reads = set(), set()
    conversion = Conversion(family, _Recording(config, gradscope_reads))
    loader = TransformersPresetLoader("unused", _Recording(config, keras_hub_reads))  # picks the converter by type
    loader.converter.convert_backbone_config(_Recording({**conversion.filled, **config}, keras_hub_reads))
    return keras_hub_reads, gradscope_reads


def test_the_field_list_is_transformers_own_for_every_checked_family():
    assert FIELDS["transformers"] == "4.53.3"
    assert set(FIELDS["families"]) == set(CHECKED_TYPES)
    for family, config in FIELDS["families"].items():
        assert config["model_type"] == family and "tie_word_embeddings" in config


@pytest.mark.parametrize("family", CHECKED_TYPES)
def test_every_field_of_a_family_is_read_carried_refused_or_outside_the_forward(family):
    config = FIELDS["families"][family]
    keras_hub_reads, gradscope_reads = _read_by(family, config)
    unaccounted = {
        field
        for field in config
        if field not in keras_hub_reads | gradscope_reads
        and field not in NOT_IN_THE_FORWARD
        and (family, field) not in DERIVED
    }
    assert not unaccounted, f"{family}: nothing reads {sorted(unaccounted)}"


def test_a_field_left_out_of_the_lists_is_caught():
    """The check above can fail: a field nobody reads (as a newer transformers might add) is reported."""
    config = {**FIELDS["families"]["llama"], "attention_temperature": 0.7}
    keras_hub_reads, gradscope_reads = _read_by("llama", config)
    assert "attention_temperature" not in keras_hub_reads | gradscope_reads | set(NOT_IN_THE_FORWARD)


def test_the_lists_name_only_fields_some_family_has():
    every = {field for config in FIELDS["families"].values() for field in config}
    assert set(NOT_IN_THE_FORWARD) <= every
    assert all(field in FIELDS["families"][family] for family, field in DERIVED)
