"""keras_hub's causal language models open block by block (issue 37): the decoder blocks of every family are
their sublayers (norms, attention, the gated MLP), computing what the block computes, at any sequence length,
padding included; the identity plan equals a plain GradientTape gradient; node ids do not depend on what ran
before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan
from tests.engine.backward.language_models import FAMILIES, feed, tape_embedding_gradient, tiny_causal_lm

pytest.importorskip("keras_hub")
keras = pytest.importorskip("keras")

IDS = [5, 17, 3, 9, 12, 1, 7, 2]


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    family = request.param
    model = tiny_causal_lm(family)
    model(feed(IDS))
    path = tmp_path_factory.mktemp(family) / f"{family}.keras"
    model.save(path)
    from gradscope.io.models import load_model

    return family, load_model(path)


def _embedding(engine: Engine) -> str:
    return next(n.id for n in engine.graph.nodes if n.op_type == "ReversibleEmbedding")


def _run(engine: Engine, inputs: dict, position: int, token: int):
    xs = [inputs[i] for i in engine.graph.input_ids]
    target = Target(kind="neuron", node=engine.graph.output_ids[0], neuron=(position, token))
    return engine.backward(xs, target, Plan(), capture=[_embedding(engine)])


def test_every_decoder_block_opens_as_its_sublayers(saved):
    family, model = saved
    engine = Engine(model)
    assert not engine.graph.notes, engine.graph.notes
    types = [n.op_type for n in engine.graph.nodes]
    assert sum(t.endswith("Attention") for t in types) == 2  # one per block, kept whole for its rules
    norms = [t for t in types if t.endswith(("Norm", "Normalization"))]
    assert len(norms) >= 5  # two per block and the final one
    if family != "gpt2":  # the gated MLP: act(gate(x)) * up(x)
        assert types.count("Multiply") >= 2 and any(n.activation in ("silu", "gelu_approximate") for n in engine.graph)
    assert any(t == "DeferredMask" for t in types)  # the block's own causal / padding / sliding-window mask


@pytest.mark.parametrize("length", [8, 11])
def test_the_identity_plan_equals_the_tape_at_any_length_with_padding(saved, length):
    family, model = saved
    engine = Engine(model)
    ids = (IDS * 2)[:length]
    padding = [1] * (length - 2) + [0, 0]  # two padded positions at the end
    inputs = feed(ids, padding)
    logits = model(inputs).numpy()
    position = length - 3
    token = int(np.argmax(logits[0, position]))
    result = _run(engine, inputs, position, token)
    np.testing.assert_allclose(result.logits, logits, rtol=1e-5, atol=1e-6)
    reference = tape_embedding_gradient(model, inputs, position, token)
    got = result.node_grads[_embedding(engine)]
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-6 * np.abs(reference).max())
    assert np.abs(got[0, position + 1 :]).max() == 0  # causal: later positions get nothing


def test_node_ids_inside_opened_blocks_do_not_depend_on_what_ran_before(saved):
    _, model = saved
    first = [n.id for n in Engine(model).graph.nodes]
    keras.ops.add(keras.ops.ones(2), 1.0)  # Keras numbers the ops it makes, process-wide
    second = [n.id for n in Engine(model).graph.nodes]
    assert (
        first == second
        and any(i.endswith("/add") for i in first)
        and not any("_1" in i.split("/")[-1] for i in first if "add" in i)
    )


LABELS = {
    "llama": "Llama",
    "llama3": "Llama 3",
    "mistral": "Mistral",
    "qwen": "Qwen 2",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3": "Gemma 3",
    "gpt2": "GPT-2",
    "phi3": "Phi-3",
}


def family_row(family: str, model) -> str:
    """The language-model guide's row for a family, computed from the opened graph."""
    engine = Engine(model)
    nodes = engine.graph.nodes
    first = next(n for n in nodes if n.op_type.endswith("Attention"))
    block = first.id.rsplit("/", 1)[0]
    inside = [n for n in nodes if n.id.startswith(block + "/")]
    norms = sorted({n.op_type for n in inside if n.op_type.endswith(("Norm", "Normalization"))})
    acts = sorted({n.activation for n in inside if n.activation})
    mlp = ("gated, " if any(n.op_type == "Multiply" for n in inside) else "") + ", ".join(acts)
    return (
        f"| {LABELS[family]} | `{type(model).__name__}` | {len(inside)} | {first.op_type} | {', '.join(norms)} "
        f"| {mlp} | yes |"
    )


def test_the_readme_lists_every_family_as_it_opens(saved):
    family, model = saved
    row = family_row(family, model)
    guide = (Path(__file__).resolve().parents[3] / "docs" / "language-models.md").read_text().splitlines()
    assert row in guide, f"docs/language-models.md should have the row:\n{row}"


def test_alike_attention_layers_share_one_traced_spec_and_the_graph_is_the_same(saved, monkeypatch):
    """The walk traces an attention layer's output spec once per class, settings, weights and input shapes (a 1 B
    Llama's 16 alike layers took 0.15 s each): the graph built so equals the one built tracing every layer."""
    import dataclasses

    from gradscope.engine.backward import keras_graph

    family, model = saved
    reused = []
    fresh = keras_graph._fresh
    monkeypatch.setattr(keras_graph, "_fresh", lambda spec: reused.append(spec) or fresh(spec))
    shared = keras_graph.build_exec_graph(model)
    # the second block's attention took the first one's spec; Gemma 2's differ (a sliding window, then none)
    assert len(reused) == (0 if family == "gemma2" else 1)
    monkeypatch.setattr(keras_graph, "_spec_key", lambda *args: None)
    before = len(reused)
    each = keras_graph.build_exec_graph(model)
    assert len(reused) == before

    def unnamed(graph):  # keras.ops inside a block are named by a process-wide counter (add_24, then add_64)
        return [dataclasses.replace(n, name="", layer_name="") for n in graph.nodes]

    assert unnamed(shared.graph) == unnamed(each.graph) and len(shared.steps) == len(each.steps)
