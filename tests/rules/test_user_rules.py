"""User rule files (resources/rules/*.py) and how errors in user rules reach the user."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.errors import RuleError, RuleFileError
from gradscope.core.resources import resource_path
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.rules.base import Rule, available_rules, load_rule_file, register_rule, rule_source
from gradscope.rules.plan import Plan

RULES_DIR = resource_path("rules")
GUIDED_FILE = RULES_DIR / "guided_backprop_example.py"
WEIGHTS_FILE = RULES_DIR / "weight_aware_example.py"


def relu_net() -> keras.Model:
    keras.utils.set_random_seed(51)
    inp = keras.Input((8, 8, 2), name="image")
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inp)
    x = keras.layers.ReLU(name="relu")(keras.layers.Conv2D(4, 3, padding="same", name="conv2")(x))
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(6, activation="relu", name="d1")(x)
    return keras.Model(inp, keras.layers.Dense(3, name="d2")(x), name="relu_net")


def dense_net() -> keras.Model:
    keras.utils.set_random_seed(52)
    inp = keras.Input((5,), name="x")
    h = keras.layers.Dense(7, activation="relu", name="d1")(inp)
    model = keras.Model(inp, keras.layers.Dense(3, name="d2")(h), name="dense_net")
    rng = np.random.default_rng(52)
    for name in ("d1", "d2"):
        k, b = model.get_layer(name).get_weights()
        model.get_layer(name).set_weights([k, rng.normal(0, 0.2, b.shape).astype("float32")])
    return model


@pytest.fixture(scope="module")
def relu_case():
    model = relu_net()
    x = np.random.default_rng(3).normal(size=(3, 8, 8, 2)).astype("float32")
    return model, Engine(model), x


# ------------------------------------------------------------------------------------------ example files
def test_guided_example_registers_and_equals_the_builtin(relu_case):
    model, engine, x = relu_case
    assert load_rule_file(GUIDED_FILE) == ["example_guided_backprop"]
    assert load_rule_file(GUIDED_FILE) == ["example_guided_backprop"]  # re-loading the same file is fine
    assert rule_source("example_guided_backprop") == str(GUIDED_FILE)
    user = engine.backward(x, Target(index=1), Plan().with_entry("activation:relu", "example_guided_backprop"))
    builtin = engine.backward(x, Target(index=1), Plan().with_entry("activation:relu", "guided_backprop"))
    assert set(user.rules) == {"conv", "relu", "d1"}
    np.testing.assert_allclose(user.input_grad, builtin.input_grad, rtol=1e-6, atol=1e-7)
    plain = engine.backward(x, Target(index=1))
    assert not np.allclose(user.input_grad, plain.input_grad, atol=1e-4)


def test_weight_aware_examples_match_numpy():
    assert load_rule_file(WEIGHTS_FILE) == ["example_excitation_backprop", "example_positive_weights"]
    model = dense_net()
    engine = Engine(model)
    x = np.random.default_rng(4).normal(size=(4, 5)).astype("float32")
    (w1, b1), (w2, _) = model.get_layer("d1").get_weights(), model.get_layer("d2").get_weights()
    z1 = x.astype(np.float64) @ w1 + b1
    a1 = np.maximum(z1, 0)
    seed = np.zeros((4, 3))
    seed[:, 2] = 1.0

    pos = engine.backward(x, Target(index=2), Plan().with_entry("type:Dense", "example_positive_weights"))
    expected = ((seed @ np.maximum(w2, 0).T) * (z1 > 0)) @ np.maximum(w1, 0).T
    np.testing.assert_allclose(pos.input_grad, expected, rtol=1e-5, atol=1e-6)

    # one MWP step on the classifier layer only, read at its input (d1): a1 ⊙ W₊ (g / (a1 W₊))
    mwp = engine.backward(x, Target(index=2), Plan().with_entry("d2", "example_excitation_backprop"), capture=["d1"])
    wp = np.maximum(w2, 0)
    z = a1 @ wp
    s = np.where(z > 0, seed / np.where(z > 0, z, 1), 0)
    expected_mwp = a1 * (s @ wp.T)
    np.testing.assert_allclose(mwp.node_grads["d1"], expected_mwp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mwp.node_grads["d1"].sum(-1), (z[:, 2] > 0).astype(float), atol=1e-5)


@register_rule("test_user_rules_probe")
class _Probe(Rule):
    """Records what a rule is given (test helper)."""

    seen: list = []

    def backward(self, ctx, grad_outputs):
        type(self).seen.append((ctx.layer, sorted(ctx.weights), ctx.weights["kernel"]))
        return ctx.vjp(grad_outputs)


def test_a_rule_receives_the_layer_and_its_weights():
    model = dense_net()
    engine = Engine(model)
    _Probe.seen.clear()
    engine.backward(np.ones((1, 5), np.float32), Target(index=0), Plan().with_entry("d2", "test_user_rules_probe"))
    layer, names, kernel = _Probe.seen[-1]
    assert layer is model.get_layer("d2")
    assert names == ["bias", "kernel"]
    assert tuple(kernel.shape) == (7, 3)


# ------------------------------------------------------------------------------------------ broken files
def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_syntax_error_names_file_and_line(tmp_path):
    path = _write(tmp_path, "bad_syntax.py", "from gradscope.rules.base import Rule\n\ndef broken(:\n    pass\n")
    with pytest.raises(RuleFileError) as err:
        load_rule_file(path)
    assert "bad_syntax.py" in str(err.value) and "line 3" in str(err.value) and "SyntaxError" in str(err.value)


def test_exception_at_import_names_file_and_line(tmp_path):
    text = "from gradscope.rules.base import Rule, register_rule\n\nx = 1\nraise ValueError('boom')\n"
    path = _write(tmp_path, "raises.py", text)
    with pytest.raises(RuleFileError) as err:
        load_rule_file(path)
    msg = str(err.value)
    assert "raises.py" in msg and "line 4" in msg and "ValueError: boom" in msg


def test_file_without_rules(tmp_path):
    path = _write(
        tmp_path, "empty_rules.py", "from gradscope.rules.base import Rule\n\nclass NotRegistered(Rule):\n    pass\n"
    )
    with pytest.raises(RuleFileError, match="empty_rules.py defines no new rules"):
        load_rule_file(path)


def test_file_that_reuses_a_builtin_name(tmp_path):
    text = (
        "from gradscope.rules.base import Rule, register_rule\n\n@register_rule('guided_backprop')\n"
        "class Clash(Rule):\n    pass\n"
    )
    with pytest.raises(RuleFileError, match="clash.py.*already registered"):
        load_rule_file(_write(tmp_path, "clash.py", text))
    assert available_rules()["guided_backprop"].__module__ == "gradscope.rules.builtin.relu_family"


def test_missing_file(tmp_path):
    with pytest.raises(RuleFileError, match="not found"):
        load_rule_file(tmp_path / "nope.py")


# ------------------------------------------------------------------------------------------ failing rules
@register_rule("test_user_rules_too_many")
class _TooMany(Rule):
    def backward(self, ctx, grad_outputs):
        return [grad_outputs[0], grad_outputs[0]]


@register_rule("test_user_rules_bad_shape")
class _BadShape(Rule):
    def backward(self, ctx, grad_outputs):
        return [ctx.tf.zeros([1, 3])]


@register_rule("test_user_rules_raises")
class _Raises(Rule):
    def backward(self, ctx, grad_outputs):
        raise ZeroDivisionError("user bug")


@register_rule("test_user_rules_bad_forward")
class _BadForward(Rule):
    """Re-runs the node with a kernel of the wrong shape: fails *inside* the layer call."""

    def backward(self, ctx, grad_outputs):
        return ctx.forward(weights={"kernel": ctx.tf.zeros([1, 1, 1, 1])})


@register_rule("test_user_rules_bad_override")
class _BadOverride(Rule):
    def forward_override(self, ctx):
        raise KeyError("no such thing")

    def backward(self, ctx, grad_outputs):
        return ctx.vjp(grad_outputs)


FAILURES = {
    "test_user_rules_too_many": ("d1", r"returned 2 gradient\(s\); the node has 1 input"),
    "test_user_rules_bad_shape": ("d1", r"gradient 0 has shape \(1, 3\), input has shape \(3, 6\)"),
    "test_user_rules_raises": ("relu", r"failed in backward\(\) on node 'relu' \(ReLU\): ZeroDivisionError: user bug"),
    "test_user_rules_bad_forward": ("conv:pre", r"failed in backward\(\) on node 'conv:pre' \(Conv2D\)"),
    "test_user_rules_bad_override": ("conv", r"failed in forward_override\(\) on node 'conv'"),
}


def _state(model):
    return [w.copy() for w in model.get_weights()], {
        layer.name: getattr(layer, "activation", None) for layer in model.layers
    }


@pytest.mark.parametrize("rule", sorted(FAILURES))
def test_failing_rule_gives_rule_error_and_leaves_the_model_unchanged(rule):
    model = relu_net()
    engine = Engine(model)
    x = np.random.default_rng(6).normal(size=(3, 8, 8, 2)).astype("float32")
    before = engine.backward(x, Target(index=0)).input_grad
    weights, acts = _state(model)
    node, pattern = FAILURES[rule]
    with pytest.raises(RuleError, match=pattern) as err:
        engine.backward(x, Target(index=0), Plan().with_entry(node, rule))
    assert repr(rule) in str(err.value) and repr(node) in str(err.value)
    now_weights, now_acts = _state(model)
    for a, b in zip(weights, now_weights):
        np.testing.assert_array_equal(a, b)
    assert now_acts == acts and model.get_layer("conv").activation is keras.activations.relu
    # the engine and the model still work: same plain gradient as before, and it is the tape gradient
    np.testing.assert_array_equal(engine.backward(x, Target(index=0)).input_grad, before)
    xt = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        score = tf.reduce_sum(model(xt, training=False)[:, 0])
    np.testing.assert_allclose(before, tape.gradient(score, xt).numpy(), rtol=1e-5, atol=1e-6)
