"""Loss targets and the gradient-flow report, checked against a hand-written NumPy backward pass."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.core.errors import GraphError, TargetError
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.engine.diagnostics.flow import FLOW_COLUMNS, FlowThresholds, dead_unit_fraction, gradient_flow
from tests.engine.diagnostics.test_paths import _cut_model, hypernet_examples

N, D, CLASSES = 6, 5, 3


def dense_net(final: str = "softmax", regularize: float = 0.0) -> keras.Model:
    """x -> Dense(4, relu) -> Dense(4, relu) -> Dense(3, final), with dead units in both ReLU layers."""
    keras.utils.set_random_seed(7)
    reg = keras.regularizers.L2(regularize) if regularize else None
    inp = keras.Input((D,), name="x")
    h = keras.layers.Dense(4, activation="relu", name="h1", kernel_regularizer=reg)(inp)
    h = keras.layers.Dense(4, activation="relu", name="h2")(h)
    out = keras.layers.Dense(CLASSES, activation=final, name="out")(h)
    model = keras.Model(inp, out, name="dense_net")
    rng = np.random.default_rng(3)
    w1, w2, w3 = rng.normal(size=(D, 4)), rng.normal(size=(4, 4)), rng.normal(size=(4, CLASSES))
    b1 = np.array([0.1, -50.0, 0.2, 0.0])  # unit 1 of h1 is dead for every sample
    b2 = np.array([-50.0, 0.3, -50.0, -50.0])  # 3 of 4 units of h2 are dead
    b3 = rng.normal(size=CLASSES) * 0.1
    model.set_weights([a.astype("float32") for a in (w1, b1, w2, b2, w3, b3)])
    return model


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, D)).astype("float32"), rng.integers(0, CLASSES, size=N)


def numpy_backward(model, x, dlogits_fn, softmax_out: bool = True):
    """Forward and backward of ``dense_net`` in float64 NumPy; ``dlogits_fn(z3, p)`` gives dL/dz3."""
    w1, b1, w2, b2, w3, b3 = [np.asarray(w, np.float64) for w in model.get_weights()]
    x = x.astype(np.float64)
    z1 = x @ w1 + b1
    a1 = np.maximum(z1, 0)
    z2 = a1 @ w2 + b2
    a2 = np.maximum(z2, 0)
    z3 = a2 @ w3 + b3
    e = np.exp(z3 - z3.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True) if softmax_out else z3
    dz3 = dlogits_fn(z3, p)
    da2 = dz3 @ w3.T
    dz2 = da2 * (z2 > 0)
    da1 = dz2 @ w2.T
    dz1 = da1 * (z1 > 0)
    return {
        "signals": {"out:pre": dz3, "h2": da2, "h2:pre": dz2, "h1": da1, "h1:pre": dz1},
        "values": {"h1": a1, "h2": a2},
        "weights": {
            "h1/kernel": x.T @ dz1,
            "h1/bias": dz1.sum(0),
            "h2/kernel": a1.T @ dz2,
            "h2/bias": dz2.sum(0),
            "out/kernel": a2.T @ dz3,
            "out/bias": dz3.sum(0),
        },
        "input": dz1 @ w1.T,
        "p": p,
    }


def ce_from_logits(labels):
    def fn(z, p):
        onehot = np.eye(CLASSES)[labels]
        return (p - onehot) / len(labels)

    return fn


def ce_loss(p, labels):
    return float(np.mean(-np.log(p[np.arange(len(labels)), labels])))


def assert_weight_grads(result, expected, rtol=2e-4, atol=1e-6):
    got = result.meta["weight_grads"]
    for path, g in expected.items():
        np.testing.assert_allclose(got[path], g, rtol=rtol, atol=atol, err_msg=path)


# ------------------------------------------------------------------------------------------------ loss targets
def test_crossentropy_from_logits_matches_numpy():
    model = dense_net()
    x, y = data()
    result = Engine(model).backward(x, Target(kind="loss", loss="crossentropy"), labels=y, weight_grads=True)
    ref = numpy_backward(model, x, ce_from_logits(y))
    assert result.meta["softmax_stripped"] and "from the logits" in result.meta["loss"]
    assert result.meta["loss_value"] == pytest.approx(ce_loss(ref["p"], y), rel=1e-5)
    assert_weight_grads(result, ref["weights"])
    np.testing.assert_allclose(result.input_grad, ref["input"], rtol=2e-4, atol=1e-7)


@pytest.mark.parametrize("variant", ["probabilities", "one_hot", "raw_logits"])
def test_crossentropy_variants_agree_with_numpy(variant):
    x, y = data(1)
    if variant == "raw_logits":  # a model without softmax: its outputs are the logits
        model = dense_net(final="linear")
        engine = Engine(model)
        assert not engine.softmax_stripped
    else:
        model = dense_net()
        engine = Engine(model, strip_softmax=variant != "probabilities")
    labels = np.eye(CLASSES, dtype="float32")[y] if variant == "one_hot" else y
    result = engine.backward(x, Target(kind="loss", loss="crossentropy"), labels=labels, weight_grads=True)
    ref = numpy_backward(model, x, ce_from_logits(y))
    expected_source = "from the softmax probabilities" if variant == "probabilities" else "from the logits"
    assert expected_source in result.meta["loss"]
    assert result.meta["loss_value"] == pytest.approx(ce_loss(ref["p"], y), rel=1e-5)
    assert_weight_grads(result, ref["weights"])


def test_mse_matches_numpy():
    model = dense_net()
    x, _ = data(2)
    t = np.random.default_rng(5).uniform(size=(N, CLASSES)).astype("float32")

    def through_softmax(z, p):
        dp = 2 * (p - t) / p.size
        return p * (dp - (dp * p).sum(1, keepdims=True))

    result = Engine(model).backward(x, Target(kind="loss", loss="mse"), labels=t, weight_grads=True)
    ref = numpy_backward(model, x, through_softmax)
    assert result.meta["loss_value"] == pytest.approx(float(np.mean((ref["p"] - t) ** 2)), rel=1e-5)
    assert_weight_grads(result, ref["weights"])


def test_compiled_loss_includes_regularization():
    model = dense_net(regularize=0.01)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy())
    x, y = data(3)
    result = Engine(model).backward(x, Target(kind="loss"), labels=y, weight_grads=True)
    assert result.meta["target"]["loss"] == "compiled"
    ref = numpy_backward(model, x, ce_from_logits(y))
    w1 = model.get_weights()[0].astype(np.float64)
    ref["weights"]["h1/kernel"] = ref["weights"]["h1/kernel"] + 0.02 * w1
    assert result.meta["loss_value"] == pytest.approx(ce_loss(ref["p"], y) + 0.01 * float((w1**2).sum()), rel=1e-5)
    assert_weight_grads(result, ref["weights"])
    with pytest.raises(TargetError, match="Got labels for 2 samples"):
        Engine(model).backward(x, Target(kind="loss"), labels=[0, 1])


def test_labels_are_data_not_trace_keys():
    model = dense_net()
    engine = Engine(model)
    x, y = data(4)
    target = Target(kind="loss", loss="crossentropy")
    engine.backward(x, target, labels=y, weight_grads=True)
    y2 = (y + 1) % CLASSES
    second = engine.backward(x, target, labels=y2, weight_grads=True)
    assert not second.meta["retraced"]
    assert_weight_grads(second, numpy_backward(model, x, ce_from_logits(y2))["weights"])


def test_auto_loss_and_errors():
    model = dense_net()
    engine = Engine(model)
    x, y = data()
    auto = engine.backward(x, Target.parse("loss"), labels=y)
    assert auto.meta["target"]["loss"] == "crossentropy"  # not compiled, (batch, classes) output
    assert Target.parse("loss:mse") == Target(kind="loss", loss="mse")
    with pytest.raises(TargetError, match="needs labels"):
        engine.backward(x, Target(kind="loss"))
    with pytest.raises(TargetError, match="class indices"):
        engine.backward(x, Target(kind="loss"), labels=np.full(N, CLASSES))
    with pytest.raises(TargetError, match="labels for a batch"):
        engine.backward(x, Target(kind="loss"), labels=[0, 1])
    with pytest.raises(TargetError, match="do not match"):
        engine.backward(x, Target(kind="loss", loss="mse"), labels=np.zeros((N, 2)))
    with pytest.raises(TargetError, match="no compiled loss"):
        engine.backward(x, Target(kind="loss", loss="compiled"), labels=y)
    with pytest.raises(TargetError, match="Unknown loss"):
        engine.backward(x, Target(kind="loss", loss="hinge"), labels=y)


# ------------------------------------------------------------------------------------------------ flow report
def test_flow_statistics_match_numpy(tmp_path):
    model = dense_net()
    x, y = data()
    report = gradient_flow(model, x, labels=y, loss="crossentropy")
    ref = numpy_backward(model, x, ce_from_logits(y))
    assert report.loss_value == pytest.approx(ce_loss(ref["p"], y), rel=1e-5)
    assert report.reference_node == "out:pre"  # the logits: the softmax node is downstream of the target
    ref_mean = np.abs(ref["signals"]["out:pre"]).mean()
    for node, g in ref["signals"].items():
        row = report.row(node)
        assert row.grad_norm == pytest.approx(np.linalg.norm(g), rel=1e-4, abs=1e-9), node
        assert row.grad_mean_abs == pytest.approx(np.abs(g).mean(), rel=1e-4, abs=1e-9), node
        assert row.grad_max_abs == pytest.approx(np.abs(g).max(), rel=1e-4, abs=1e-9), node
        assert row.grad_zero_fraction == pytest.approx((g == 0).mean(), abs=1e-6), node
        assert row.grad_relative == pytest.approx(np.abs(g).mean() / ref_mean, rel=1e-4, abs=1e-9), node
    weights = dict(zip(["h1:pre", "h2:pre", "out:pre"], np.split(np.array(model.get_weights(), dtype=object), 3)))
    for node, (w, b) in weights.items():
        row = report.row(node)
        layer = node.removesuffix(":pre")
        gw, gb = ref["weights"][f"{layer}/kernel"], ref["weights"][f"{layer}/bias"]
        norm = math.sqrt((w.astype(float) ** 2).sum() + (b.astype(float) ** 2).sum())
        gnorm = math.sqrt((gw**2).sum() + (gb**2).sum())
        assert row.weight_paths == (f"{layer}/kernel", f"{layer}/bias")
        assert row.weight_norm == pytest.approx(norm, rel=1e-5)
        assert row.weight_grad_norm == pytest.approx(gnorm, rel=2e-4)
        assert row.weight_ratio == pytest.approx(gnorm / norm, rel=2e-4)
        assert row.weight_grad_max_abs == pytest.approx(max(np.abs(gw).max(), np.abs(gb).max()), rel=2e-4)
        all_g = np.concatenate([gw.ravel(), gb.ravel()])
        assert row.weight_grad_mean_abs == pytest.approx(np.abs(all_g).mean(), rel=2e-4)
    # dead ReLU: units that are 0 for every sample (h1: 1 of 4, h2: 3 of 4); only h2 crosses the 50% threshold
    for node, expected in (("h1", 0.25), ("h2", 0.75)):
        numpy_dead = np.all(ref["values"][node] == 0, axis=0).mean()
        assert numpy_dead == expected  # the fixture is what it claims
        assert report.row(node).dead_relu_fraction == pytest.approx(expected)
    assert "dead_relu" in report.row("h2").flags and "dead_relu" not in report.row("h1").flags
    assert report.row("out").status == "none" and "no_gradient" not in report.row("out").flags
    assert report.row("h1:pre").dead_relu_fraction is None
    # the CSV holds the same numbers
    path = report.to_csv(tmp_path / "flow.csv")
    rows = list(csv.DictReader(path.open()))
    assert tuple(rows[0].keys()) == FLOW_COLUMNS
    by_node = {r["node"]: r for r in rows}
    assert float(by_node["h1:pre"]["weight_ratio"]) == pytest.approx(report.row("h1:pre").weight_ratio, rel=1e-6)
    assert by_node["h2"]["flags"] == "dead_relu" and by_node["h1:pre"]["dead_relu_fraction"] == ""
    assert len(rows) == len(report.rows) == len(model.layers) - 1 + 3  # three split activations
    report.weights_to_csv(tmp_path / "weights.csv")
    assert "thresholds" in report.to_text() and report.to_dict()["thresholds"]["dead_relu"] == 0.5


def test_dead_unit_fraction_per_channel():
    v = np.zeros((2, 3, 3, 4))
    v[0, 1, 1, 0] = 1.0  # channel 0 alive at one position of one sample
    v[1, :, :, 2] = 0.5
    assert dead_unit_fraction(v) == 0.5


def _scaled_net(scale: float) -> keras.Model:
    keras.utils.set_random_seed(9)
    inp = keras.Input((4,))
    x = keras.layers.Dense(4, name="low")(inp)
    x = keras.layers.Rescaling(scale, name="scale")(x)
    x = keras.layers.Dense(3, name="high")(x)
    return keras.Model(inp, x)


@pytest.mark.parametrize(("scale", "flag"), [(1e-8, "vanishing"), (1e8, "exploding")])
def test_vanishing_and_exploding_flags_use_the_thresholds(scale, flag):
    model = _scaled_net(scale)
    x = np.random.default_rng(0).normal(size=(4, 4)).astype("float32")
    report = gradient_flow(model, x, labels=[0, 1, 2, 0])
    assert flag in report.row("low").flags
    assert flag not in report.row("scale").flags
    high = report.row("high")
    if flag == "vanishing":
        assert not high.flags
    else:  # its inputs are 1e8 times larger, so is its kernel's gradient: |grad W| / |W| explodes too
        assert high.weight_ratio > 10 and high.grad_relative == pytest.approx(1.0)
    rel = report.row("low").grad_relative
    assert (rel < 1e-6) if flag == "vanishing" else (rel > 1e6)
    loose = FlowThresholds(
        vanishing_activation=1e-12, exploding_activation=1e12, vanishing_ratio=0, exploding_ratio=1e12
    )
    assert flag not in gradient_flow(model, x, labels=[0, 1, 2, 0], thresholds=loose).row("low").flags


def test_nan_and_cut_paths_are_flagged():
    model = dense_net()
    x, y = data()
    x[0, 0] = np.nan  # reaches at least h1's kernel gradient (x^T dz)
    report = gradient_flow(model, x, labels=y)
    assert "nan" in report.row("h1:pre").flags and report.row("h1:pre").weight_nan >= 4
    weights = model.get_weights()
    weights[4][0, 0] = np.nan  # a NaN weight in the classifier: every signal below it is NaN
    model.set_weights(weights)
    report = gradient_flow(model, x, labels=y)
    for node in ("out:pre", "h2", "h2:pre", "h1", "h1:pre"):
        row = report.row(node)
        assert "nan" in row.flags and row.grad_nan > 0, node
    cut = gradient_flow(_cut_model("stop_gradient"), np.ones((2, 4), "float32"))  # top-1 logit, no labels
    assert "no_gradient" in cut.row("pre").flags and "weights_no_gradient" in cut.row("pre").flags
    assert cut.row("pre").weights_without_gradient == ("pre/kernel", "pre/bias")
    assert not cut.row("main").flags
    with pytest.raises(TargetError, match="needs labels"):
        gradient_flow(model, x, loss="mse")


def weights_row(report, layer: str):
    """The row of the node that holds ``layer``'s weights (its linear part, when the layer has a fused activation)."""
    (row,) = [r for r in report.rows if r.layer == layer and r.weight_paths]
    return row


def test_flow_shows_the_hypernetwork_gradient():
    be = hypernet_examples()
    inputs, labels = be.make_data(16)
    tensor = gradient_flow(be.build("tensor"), inputs, labels=labels)
    assign = gradient_flow(be.build("assign"), inputs, labels=labels)
    assert tensor.target.startswith("compiled loss")
    for layer in ("hyper_hidden", "hyper_head"):
        row, broken = weights_row(tensor, layer), weights_row(assign, layer)  # "<layer>:pre" if fused
        assert row.weight_grad_norm > 0 and not row.flags
        assert "weights_no_gradient" in broken.flags
        assert set(broken.weights_without_gradient) == {f"{layer}/kernel", f"{layer}/bias"}
    assert all(w.is_none == w.path.startswith("hyper_") for w in assign.weights)


def test_flow_reports_a_backward_pass_that_cannot_run():
    from tensorflow import raw_ops

    class RawBitcast(keras.layers.Layer):
        def call(self, x):
            return raw_ops.Bitcast(input=x, type="float32")

    inp = keras.Input((3,))
    model = keras.Model(inp, keras.layers.Dense(2)(RawBitcast()(keras.layers.Dense(3)(inp))))
    with pytest.raises(GraphError, match="gradscope diagnose"):
        gradient_flow(model, np.ones((2, 3), "float32"))


def test_cli_flow_writes_csv_and_png(tmp_path, capsys):
    from PIL import Image

    from gradscope.cli import main

    be = hypernet_examples()
    (x, c), y = be.make_data(8)
    np.savez(tmp_path / "inputs.npz", x, c)
    np.save(tmp_path / "labels.npy", y)
    hypernet = be.HERE
    args = ["-q", "flow", str(hypernet / "hypernet_assign.keras"), "--custom-objects", str(hypernet / "hyperlayers.py")]
    args += ["--input", str(tmp_path / "inputs.npz"), "--label", str(tmp_path / "labels.npy")]
    assert main([*args, "--csv", str(tmp_path / "flow.csv"), "--png", str(tmp_path / "flow.png")]) == 0
    assert "weights_no_gradient" in capsys.readouterr().out
    rows = {r["node"]: r for r in csv.DictReader((tmp_path / "flow.csv").open())}
    assert "weights_no_gradient" in rows["hyper_head"]["flags"] and rows["classifier:pre"]["weight_ratio"]
    assert Image.open(tmp_path / "flow.png").size[1] > 16 * len(rows)
    # user errors are one line and exit code 2: an input file that is missing, labels that are not numbers
    assert main([*args[:5], "--input", str(tmp_path / "missing.npy")]) == 2
    assert "Input file not found" in capsys.readouterr().err
    assert main([*args, "--label", "cat,dog"]) == 2
    assert "Cannot read labels" in capsys.readouterr().err


def test_a_fitted_batch_flags_no_vanishing_and_says_why():
    """At loss 0 every gradient is zero by the loss's doing: no node is "vanishing" (11 of 23 were), the report
    says so; a batch the model gets wrong is flagged as before."""
    model = _scaled_net(1e-8)
    x = np.random.default_rng(0).normal(size=(4, 4)).astype("float32")
    fitted = gradient_flow(model, x, labels=np.asarray(model(x)), loss="mse")
    assert fitted.loss_value == pytest.approx(0.0, abs=1e-12)
    assert not any({"vanishing", "zero_gradient", "weights_zero_gradient"} & set(r.flags) for r in fitted.rows)
    assert "already fitted" in fitted.to_text()
    wrong = gradient_flow(model, x, labels=np.asarray(model(x)) + 1.0, loss="mse")
    assert "vanishing" in wrong.row("low").flags and "note" not in wrong.meta


def test_the_picture_draws_the_weights_panel_only_when_their_gradients_were_taken():
    """``gs.graph`` takes no weight gradients: its flow picture had an empty "|grad W| / |W|" panel."""
    import dataclasses

    from gradscope.engine.diagnostics.flow import flow_picture

    x, y = data()
    report = gradient_flow(dense_net(), x, labels=y, loss="crossentropy")
    assert any(math.isfinite(r.weight_ratio) for r in report.rows)
    without = dataclasses.replace(
        report, rows=[dataclasses.replace(r, weight_ratio=math.nan, weight_paths=()) for r in report.rows], weights=[]
    )
    full, bare = flow_picture(report), flow_picture(without)
    assert full.shape[0] == bare.shape[0] and full.shape[1] - bare.shape[1] == 260  # one panel and its gap
    left = 8 + 7 * max(len(r.node) for r in report.rows) + 240  # the labels and the gradients' panel
    np.testing.assert_array_equal(full[44:, :left], bare[44:, :left])  # drawn alike
