"""The "Supported models" guide's table (docs/models.md), kept true: for a small version of each model kind users
bring, the identity plan equals a plain tf.GradientTape gradient, and the presets do what the table says (rules
per layer or an explicit, warned pass-through)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gradscope.backend import tf
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.methods import build_method
from gradscope.rules.plan import Plan
from tests.engine.model_kinds import KINDS, inputs_for

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "models.md"


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request):
    model = KINDS[request.param]()
    return request.param, model, Engine(model)


def _tape(model, xs, index):
    """d(first output's logit ``index``)/d(float inputs), with plain Keras and TensorFlow."""
    ts = [tf.convert_to_tensor(x) for x in xs]
    with tf.GradientTape() as tape:
        for t in ts:
            tape.watch(t)
        out = model(ts if len(ts) > 1 else ts[0])
        out = out[0] if isinstance(out, (list, tuple)) else out
        score = tf.reduce_sum(out[:, index])
    return tape.gradient(score, ts)


def test_identity_plan_equals_the_tape_gradient(kind):
    name, model, _ = kind
    engine = Engine(model, strip_softmax=False)  # the tape differentiates the model's own output
    xs = inputs_for(engine)
    result = engine.backward(xs, Target(index=1), Plan())
    integer = ["int" in engine.graph.node(i).dtype for i in engine.graph.input_ids]
    expected = _tape(model, [x.astype("int32") if i else x for x, i in zip(xs, integer)], 1)
    for got, want, is_int, none in zip(result.input_grads, expected, integer, result.meta["input_is_none"]):
        if is_int:  # token ids have no gradient; the signal starts at the embedding (checked below)
            assert want is None and none
            continue
        assert np.abs(want).max() > 0
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    if any(integer):
        emb = model.get_layer("emb")
        e = emb(xs[0].astype("int32"))
        with tf.GradientTape() as tape:
            tape.watch(e)
            score = tf.reduce_sum(model.get_layer("out")(model.get_layer("lstm")(e))[:, 1])
        signal = engine.backward(xs, Target(index=1), Plan(), capture=["emb"]).node_grads["emb"]
        np.testing.assert_allclose(signal, tape.gradient(score, e).numpy(), rtol=1e-5, atol=1e-6)


def table_row(name: str, engine: Engine) -> str:
    """What the guide says about one kind, computed from what the presets do."""
    guided = build_method("guided_backprop", engine.graph)
    relu = f"{len(guided.changed)} ReLU node(s)" if guided.changed else "no ReLU: warned, = gradient"
    passed = set()
    for preset in ("mwp", "cmwp", "lrp_epsilon"):
        for warning in build_method(preset, engine.graph).warnings:
            match = re.search(r"no rule for (\w+) node", warning)
            if match:
                passed.add(match.group(1))
    layerwise = "a rule on every layer" if not passed else "pass-through (warned): " + ", ".join(sorted(passed))
    cp = build_method("cp_lrp", engine.graph)
    parts = sorted({engine.graph.node(n).op_type for n in cp.changed})
    transformer = "rules on " + ", ".join(parts) if parts else "n/a (no attention or LayerNorm)"
    return f"| {name} | {len(engine.graph)} | yes | {relu} | {layerwise} | {transformer} |"


def test_presets_do_what_the_readme_table_says(kind):
    name, model, engine = kind
    row = table_row(name, engine)
    assert row in GUIDE.read_text().splitlines(), f"docs/models.md should have the row:\n{row}"
    xs = inputs_for(engine)
    for preset in ("guided_backprop", "mwp", "lrp_epsilon", "attnlrp", "cp_lrp"):
        result = engine.backward(xs, Target(index=1), build_method(preset, engine.graph).plan)
        assert all(np.isfinite(g).all() for g in result.input_grads), preset
