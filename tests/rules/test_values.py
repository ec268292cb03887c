"""A node's value substituted (issue 59; RULES_SPEC §10): ``substitute_value`` (backward as if the node had output
a2, the forward its own) and ``patch_value`` (forward and backward at a2), checked against the derivative worked
out by hand in float64 NumPy on the founding question's own network (dense -> relu -> dense, as in its TF1
answer, with a tanh layer above so the Jacobians above the node depend on a2), every source and mask, a plan file,
a value function from a rule file, and a2 = a1 giving the plain tape gradient in every dtype the model runs in."""

from __future__ import annotations

import numpy as np
import pytest

import gradscope as gs
from gradscope.backend import keras, tf
from gradscope.core.errors import PlanError, RuleError
from gradscope.engine.backward.runner import Engine
from gradscope.rules.plan import Plan


def network(dtype: str = "float32") -> keras.Model:
    keras.utils.set_random_seed(7)
    i = keras.Input((4,))
    h = keras.layers.Dense(6, activation="relu", name="hidden", dtype=dtype)(i)
    t = keras.layers.Dense(5, activation="tanh", name="up", dtype=dtype)(h)
    return keras.Model(i, keras.layers.Dense(3, name="out", dtype=dtype)(t))


def weights(model):
    return [[w.numpy().astype(np.float64) for w in model.get_layer(n).weights] for n in ("hidden", "up", "out")]


def by_hand(model, x, a2, c, *, patch=False, mask=None):
    """(logits, d logit_c / d x) of the network with the hidden relu's value a2 where ``mask`` (all: None): in the
    backward only (the layers above and the relu's own derivative at a2, the logits of a1), or patched."""
    (w1, b1), (w2, b2), (w3, b3) = weights(model)
    x = x.astype(np.float64)
    a1 = np.maximum(x @ w1 + b1, 0)
    mask = np.ones_like(a1, bool) if mask is None else np.broadcast_to(mask, a1.shape)
    a = np.where(mask, a2, a1)
    logits = np.tanh((a if patch else a1) @ w2 + b2) @ w3 + b3
    g_h = w2 @ ((1 - np.tanh(a @ w2 + b2) ** 2)[0] * w3[:, c])
    if patch:  # d a / d a1 is 1 where a1 stays, 0 where a2 (a constant) replaces it; relu' at the real input
        return logits, w1 @ (np.where(mask[0], 0.0, 1.0) * (a1[0] > 0) * g_h)
    return logits, w1 @ (np.where(mask[0], a[0] > 0, a1[0] > 0) * g_h)


X = np.array([[0.5, -1.2, 0.8, 0.3]], np.float32)
X2 = np.array([[-0.7, 0.4, 1.1, -0.9]], np.float32)


def run(model, entry, params, target=None, alternate=None, x=X):
    engine = Engine(model)
    plan = Plan().with_entry("hidden", entry, params)
    return engine, engine.backward(x, target or gs.Target(index=0), plan, alternate=alternate)


@pytest.mark.parametrize("patch", [False, True])
def test_the_founding_question_value_from_another_input(patch):
    model = network()
    (w1, b1), _, _ = weights(model)
    a2 = np.maximum(X2.astype(np.float64) @ w1 + b1, 0)
    _, r = run(model, "patch_value" if patch else "substitute_value", {"source": "input"}, alternate=X2)
    logits, grad = by_hand(model, X, a2, 0, patch=patch)
    np.testing.assert_allclose(r.logits, logits, atol=1e-5)  # backward only: the model's own logits
    np.testing.assert_allclose(r.input_grad[0], grad, atol=1e-5)


@pytest.mark.parametrize(
    ("params", "a2"),
    [
        ({"source": "zero"}, lambda a1: np.zeros_like(a1)),
        ({"source": "constant", "value": 0.7}, lambda a1: np.full_like(a1, 0.7)),
        ({"source": "scale", "factor": -2.0}, lambda a1: -2.0 * a1),
        ({"source": "zero", "channels": [1, 4]}, lambda a1: np.where(np.isin(np.arange(6), [1, 4]), 0.0, a1)),
    ],
)
def test_every_source_and_a_channel_mask_backward_at_a2(params, a2):
    model = network()
    (w1, b1), _, _ = weights(model)
    a1 = np.maximum(X.astype(np.float64) @ w1 + b1, 0)
    _, r = run(model, "substitute_value", params)
    np.testing.assert_allclose(r.input_grad[0], by_hand(model, X, a2(a1), 0)[1], atol=1e-5)


def test_a_scaled_patch_is_differentiated_through_the_scale():
    """a2 = 2 a1 in the forward: the gradient is the patched model's, 2 x relu' below the node."""
    model = network()
    (w1, b1), (w2, b2), (w3, b3) = weights(model)
    a1 = np.maximum(X.astype(np.float64) @ w1 + b1, 0)
    _, r = run(model, "patch_value", {"source": "scale", "factor": 2.0})
    g_h = w2 @ ((1 - np.tanh(2 * a1 @ w2 + b2) ** 2)[0] * w3[:, 0])
    np.testing.assert_allclose(r.input_grad[0], w1 @ (2 * (a1[0] > 0) * g_h), atol=1e-5)


def test_mean_over_another_batch_and_over_this_batch():
    model = network()
    (w1, b1), _, _ = weights(model)
    others = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    mean = np.maximum(others.astype(np.float64) @ w1 + b1, 0).mean(axis=0, keepdims=True)
    _, r = run(model, "patch_value", {"source": "mean"}, alternate=others)
    np.testing.assert_allclose(r.logits, by_hand(model, X, mean, 0, patch=True)[0], atol=1e-5)
    batch = np.concatenate([X, X2])
    _, r = run(model, "substitute_value", {"source": "mean"}, x=batch)
    own = np.maximum(batch.astype(np.float64) @ w1 + b1, 0).mean(axis=0, keepdims=True)
    np.testing.assert_allclose(r.input_grad[:1][0], by_hand(model, X, own, 0)[1], atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "mixed_bfloat16"])
def test_a2_equal_to_a1_gives_the_plain_gradient_in_every_dtype(dtype):
    model = network(dtype)
    x = tf.constant(X)
    with tf.GradientTape() as tape:
        tape.watch(x)
        logit = model(x)[:, 0]
    want = tape.gradient(logit, x).numpy()
    tolerance = 1e-6 if dtype == "float32" else 2e-2
    for entry in ("substitute_value", "patch_value"):
        _, r = run(model, entry, {"source": "scale", "factor": 1.0})
        np.testing.assert_allclose(r.input_grad, want, atol=tolerance * np.abs(want).max())


def test_positions_and_regions_pick_what_they_say():
    """A token model's positions and an image model's region, against the same value masked by hand."""
    keras.utils.set_random_seed(3)
    ids = keras.Input((None,), dtype="int32")
    emb = keras.layers.Embedding(20, 4, name="emb")(ids)
    out = keras.layers.Dense(3, name="out")(keras.layers.GlobalAveragePooling1D(name="pool")(emb))
    engine = Engine(keras.Model(ids, out))
    x = np.array([[3, 7, 1, 9]])
    plan = Plan().with_entry("emb", "patch_value", {"source": "zero", "positions": [1, -1]})
    r = engine.backward(x, gs.Target(index=2), plan)
    e = engine.model.get_layer("emb")(x).numpy()
    e[:, [1, 3]] = 0
    np.testing.assert_allclose(r.logits, engine.model.get_layer("out")(e.mean(axis=1)).numpy(), atol=1e-6)

    keras.utils.set_random_seed(4)
    i = keras.Input((6, 6, 2))
    c = keras.layers.Conv2D(3, 1, name="conv")(i)
    o = keras.layers.Dense(2, name="out")(keras.layers.GlobalAveragePooling2D(name="gap")(c))
    engine = Engine(keras.Model(i, o))
    img = np.random.default_rng(1).uniform(size=(1, 6, 6, 2)).astype(np.float32)
    plan = Plan().with_entry("conv", "patch_value", {"source": "constant", "value": 1.0, "region": [1, 2, 4, 5]})
    r = engine.backward(img, gs.Target(index=0), plan)
    a = engine.model.get_layer("conv")(img).numpy()
    a[:, 1:4, 2:5] = 1.0
    np.testing.assert_allclose(r.logits, engine.model.get_layer("out")(a.mean(axis=(1, 2))).numpy(), atol=1e-6)


def test_a_value_function_from_a_rule_file_and_a_plan_file(tmp_path):
    rules = tmp_path / "values.py"
    rules.write_text(
        "import gradscope\n\n@gradscope.register_value('halfway')\n"
        "def halfway(a1, source):\n    return (a1 + source) / 2\n"
    )
    assert gs.load_rule_file(rules) == ["halfway (value)"]
    model = network()
    (w1, b1), _, _ = weights(model)
    a1, a2 = (np.maximum(v.astype(np.float64) @ w1 + b1, 0) for v in (X, X2))
    plan_file = tmp_path / "plan.json"
    plan_file.write_text('{"entries": [{"select": "hidden", "rule": "patch_value", '
                         '"params": {"source": "function", "function": "halfway"}}]}')  # fmt: skip
    r = Engine(model).backward(X, gs.Target(index=0), Plan.load(plan_file), alternate=X2)
    np.testing.assert_allclose(r.logits, by_hand(model, X, (a1 + a2) / 2, 0, patch=True)[0], atol=1e-5)


def test_mistakes_are_one_line():
    model = network()
    with pytest.raises(PlanError, match="source is one of"):
        Plan().with_entry("hidden", "patch_value", {"source": "corrupt"}).resolve(Engine(model).graph)
    with pytest.raises(PlanError, match="positions is a list of whole numbers"):
        Plan().with_entry("hidden", "patch_value", {"positions": "1,2"}).resolve(Engine(model).graph)
    with pytest.raises(RuleError, match="takes its value from another input: give one"):
        run(model, "substitute_value", {"source": "input"})
    with pytest.raises(RuleError, match="No value function 'nope'"):
        run(model, "patch_value", {"source": "function", "function": "nope"})
    with pytest.raises(RuleError, match="positions pick along axis 1"):
        run(model, "patch_value", {"positions": [0]})
