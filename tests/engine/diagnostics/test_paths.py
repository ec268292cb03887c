"""Path diagnostics: every kind of cut is found and named, connected models report nothing."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from gradscope.backend import keras, tf
from gradscope.core.resources import resource_path
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.engine.diagnostics.paths import diagnose_model
from tests.engine.fixtures import FIXTURES

HYPERNET = resource_path("hypernet")


def hypernet_examples():
    name = "gradscope_hypernet_build_examples"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HYPERNET / "build_examples.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# ------------------------------------------------------------------------------------------------ cut models
class AssignThenCall(keras.layers.Layer):
    """Writes its input (batch mean) into a Dense layer's kernel, then calls that layer: cuts the input's path."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(1, name="written")

    def build(self, shapes):
        self.inner.build(shapes[0])

    def call(self, inputs):
        x, w = inputs
        self.inner.kernel.assign(keras.ops.reshape(keras.ops.mean(w, axis=0), (-1, 1)))
        return self.inner(x)


class NumpyDouble(keras.layers.Layer):
    def call(self, x):
        y = tf.numpy_function(lambda a: (a * 2).astype(np.float32), [x], tf.float32)
        y.set_shape(x.shape)
        return y


class UnusedWeight(keras.layers.Layer):
    """Creates a weight it never reads."""

    def build(self, shape):
        self.spare = self.add_weight(name="spare", shape=(3,))

    def call(self, x):
        return x


class ReadButDropped(keras.layers.Layer):
    """Reads a weight, computes with it, and throws the result away."""

    def build(self, shape):
        self.dropped = self.add_weight(name="dropped", shape=(shape[-1],))

    def call(self, x):
        _ = x * self.dropped
        return x + 0.0


def _cut_model(kind: str) -> keras.Model:
    """A model with a connected main branch and a side branch ``pre`` whose path to the output is cut."""
    keras.utils.set_random_seed(11)
    inp = keras.Input((4,), name="x")
    main = keras.layers.Dense(3, name="main")(inp)
    pre = keras.layers.Dense(4 if kind == "assign" else 3, name="pre")(inp)
    if kind == "assign":
        side = AssignThenCall(name="cutter")([inp, pre])
        side = keras.ops.repeat(side, 3, axis=1)
    elif kind == "stop_gradient":
        side = keras.ops.stop_gradient(pre)
    elif kind == "argmax":
        side = keras.ops.cast(keras.ops.argmax(pre, axis=-1), "float32")[:, None] * keras.ops.ones((1, 3))
    elif kind == "cast_int":
        side = keras.ops.cast(keras.ops.cast(pre, "int32"), "float32")
    elif kind == "round":
        side = keras.ops.round(pre)
    elif kind == "numpy_function":
        side = NumpyDouble(name="cutter")(pre)
    else:
        raise ValueError(kind)
    out = keras.layers.Add(name="add")([main, side])
    return keras.Model(inp, out, name=f"cut_{kind}")


# kind -> (TF op type that cuts, cut kind)
CUTS = {
    "assign": ("AssignVariableOp", "state_write"),
    "stop_gradient": ("StopGradient", "stop_gradient"),
    "argmax": ("ArgMax", "integer"),
    "cast_int": ("Cast", "integer"),
    "round": ("Round", "integer"),
    "numpy_function": ("PyFunc", "no_gradient"),
}


@pytest.mark.parametrize("kind", sorted(CUTS))
def test_each_cut_is_found_and_named(kind):
    model = _cut_model(kind)
    engine = Engine(model)
    report = diagnose_model(engine)
    op_type, cut_kind = CUTS[kind]
    status = {v.path: v.status for v in report.variables}
    assert status["main/kernel"] == status["main/bias"] == "connected"
    assert status["pre/kernel"] == status["pre/bias"] == "blocked"
    assert not report.ok
    blocked = [v for v in report.variables if v.path.startswith("pre/")]
    for v in blocked:
        assert v.cut is not None
        assert v.cut.op_type == op_type
        assert v.cut.kind == cut_kind
        # the cut op is created by the node that holds it, and that node exists in the graph
        cut_node = engine.graph.node(v.cut.node)
        assert v.cut.layer == cut_node.layer_name
        assert v.path_nodes[0] == "pre" and v.path_nodes[-1] == v.cut.node
        assert all(n in engine.graph for n in v.path_nodes)
        assert v.path_ops[-1] == v.cut.op_name
        assert op_type in v.message() and v.cut.op_name in v.message()
    # the reported cut really is on a path from the variable: its node descends from "pre"
    assert v.cut.node in _descendants(engine.graph, "pre")
    # and really cuts the gradient: a tape gives None for "pre", not for "main"
    x = tf.random.normal((2, 4))
    with tf.GradientTape() as tape:
        out = tf.reduce_sum(model(x))
    grads = tape.gradient(out, model.trainable_variables)
    none = {v.path for v, g in zip(model.trainable_variables, grads) if g is None}
    assert {v.path for v in blocked} <= none
    text = report.to_text()
    assert "CUT at op" in text and op_type in text and "fix:" in text
    json.dumps(report.to_dict())
    roles = report.highlight()
    assert roles[v.cut.node] == "cut" and roles["pre"] == "blocked"


def _descendants(graph, node_id):
    out, stack = {node_id}, [node_id]
    while stack:
        for child in graph.children(stack.pop()):
            if child.id not in out:
                out.add(child.id)
                stack.append(child.id)
    return out


def test_assign_names_the_written_variable_and_suggests_tensors():
    report = diagnose_model(_cut_model("assign"))
    ((cut, blocked),) = report.cuts()
    assert cut.writes_variable == "cutter/written/kernel"
    assert cut.node == "cutter"
    assert "stateless_call" in cut.fix and "assign" in cut.reason
    assert {v.path for v in blocked} == {"pre/kernel", "pre/bias"}
    # the written variable is itself trainable: its own updates are overwritten every step
    assert any("cutter/written/kernel" in n and "overwritten" in n for n in report.notes)


def test_no_gradient_op_without_registry_entry_is_reported_by_both_levels():
    class RawBitcast(keras.layers.Layer):
        def call(self, x):
            return tf.raw_ops.Bitcast(input=x, type=tf.float32)  # float -> float, no registered gradient

    inp = keras.Input((4,))
    side = RawBitcast(name="bitcast")(keras.layers.Dense(3, name="pre")(inp))
    model = keras.Model(inp, keras.layers.Add()([side, keras.layers.Dense(3, name="main")(inp)]))
    report = diagnose_model(model)
    assert report.level1_error and "Bitcast" in report.level1_error
    assert not report.ok
    pre = [v for v in report.variables if v.path.startswith("pre/")]
    assert all(v.status == "blocked" and v.cut.op_type == "Bitcast" and v.cut.kind == "no_gradient" for v in pre)
    assert all(v.status == "connected" for v in report.variables if v.path.startswith("main/"))


def test_never_read_and_unused_variables():
    keras.utils.set_random_seed(3)
    inp = keras.Input((3,))
    x = UnusedWeight(name="spare_layer")(inp)
    x = ReadButDropped(name="dropper")(x)
    model = keras.Model(inp, keras.layers.Dense(2, name="out")(x))
    report = diagnose_model(model)
    status = {v.path: v.status for v in report.variables}
    assert status == {
        "spare_layer/spare": "never_read",
        "dropper/dropped": "unused",
        "out/kernel": "connected",
        "out/bias": "connected",
    }
    assert {v.node for v in report.problems} == {"spare_layer", "dropper"}
    assert "NEVER READ" in report.to_text() and "UNUSED" in report.to_text()


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_connected_models_report_nothing(name):
    report = diagnose_model(FIXTURES[name]())
    assert report.ok, report.to_text()
    assert report.variables and all(v.connected and not v.note for v in report.variables)
    assert report.cuts() == [] and report.highlight() == {} and report.notes == []


def test_loss_target_and_given_inputs():
    model = FIXTURES["chain"]()
    model.compile(loss="sparse_categorical_crossentropy")
    x = np.random.default_rng(0).normal(size=(3, 10, 10, 3)).astype("float32")
    report = diagnose_model(model, x, Target(kind="loss"), labels=[0, 1, 2])
    assert report.ok and "loss" in report.target
    report = diagnose_model(model, x, Target(kind="channel", node="conv1", channel=1))
    status = {v.path: v.status for v in report.variables}
    assert status["conv1/kernel"] == "connected"
    assert status["probs/kernel"] == "unused"  # above the target node: never on its path


def test_mobilenet_v2_has_no_false_positives():
    model = keras.applications.MobileNetV2(weights=None, input_shape=(96, 96, 3), alpha=0.35)
    report = diagnose_model(model)
    assert report.ok, report.to_text()
    # level 2 agrees: every variable has a differentiable path in the walked graph (no disagreement notes)
    assert all(not v.note for v in report.variables)
    assert len(report.variables) == len(model.trainable_variables) and report.n_ops > 500


@pytest.mark.slow
def test_resnet50_has_no_false_positives():
    model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3))
    report = diagnose_model(model)
    assert report.ok and all(not v.note for v in report.variables), report.to_text()


# ------------------------------------------------------------------------------------------------ hypernetworks
@pytest.fixture(scope="module")
def saved_hypernets():
    be = hypernet_examples()
    layers = be.hyperlayers()
    objects = {f"{layers.PACKAGE}>AssignedDense": layers.AssignedDense, "PredictedDense": layers.PredictedDense}
    return {kind: keras.saving.load_model(HYPERNET / f, custom_objects=objects) for kind, f in be.FILES.items()}


def test_hypernet_assign_is_diagnosed(saved_hypernets):
    model = saved_hypernets["assign"]
    before = [v.numpy().copy() for v in model.variables]
    report = diagnose_model(model)
    blocked = {v.path for v in report.by_status("blocked")}
    assert blocked == {"hyper_hidden/kernel", "hyper_hidden/bias", "hyper_head/kernel", "hyper_head/bias"}
    ((cut, _),) = report.cuts()
    assert cut.op_type == "AssignVariableOp" and cut.node == "target_dense" and cut.layer == "target_dense"
    assert cut.writes_variable == "target_dense/target/kernel"
    assert "stateless_call" in cut.fix
    head = next(v for v in report.variables if v.path == "hyper_hidden/kernel")
    assert head.path_nodes[0] == "hyper_hidden:pre" and head.path_nodes[-2:] == ("hyper_head", "target_dense")
    # diagnosing traces, it does not run: the assign did not change the model
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.variables))


def test_hypernet_tensor_is_connected_and_the_weights_edge_is_in_the_graph(saved_hypernets):
    report = diagnose_model(saved_hypernets["tensor"])
    assert report.ok, report.to_text()
    for model in saved_hypernets.values():
        graph = Engine(model).graph
        assert ("hyper_head", "target_dense") in graph.edges()  # the predicted-weights edge
        assert ("features", "target_dense") in graph.edges()


def test_saved_examples_match_the_builder():
    be = hypernet_examples()
    for kind, f in be.FILES.items():
        assert (HYPERNET / f).stat().st_size < 1_000_000
        built = be.build(kind)
        saved = keras.saving.load_model(HYPERNET / f)
        assert [v.path for v in built.weights] == [v.path for v in saved.weights]


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_diagnose_exit_codes(capsys):
    from gradscope.cli import main

    custom = ["--custom-objects", str(HYPERNET / "hyperlayers.py")]
    assert main(["-q", "diagnose", str(HYPERNET / "hypernet_assign.keras"), *custom]) == 1
    out = capsys.readouterr().out
    assert "AssignVariableOp" in out and "target_dense" in out and "stateless_call" in out
    assert main(["-q", "diagnose", str(HYPERNET / "hypernet_tensor.keras"), *custom, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
