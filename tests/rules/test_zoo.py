"""Zoo smoke test: every method preset runs on keras.applications architectures (weights=None, small inputs)
and gives a finite map of the right shape; layers a preset cannot handle are reported by node id.

Only what a method guarantees is asserted. Whether a random-init network's map is non-zero depends on the
floating-point details of the CPU's kernels (oneDNN picks them per machine): c-MWP's ``max(Σ_c Δ, 0)`` was all
zero on one CPU and not on another. A map with no information must be *reported* as degenerate instead.

Untrained nets with fresh BatchNorm statistics are degenerate (activations shrink to ~1e-10 by the top of
MobileNetV2, so every ε-stabilised rule returns exactly 0). The BN moving statistics are therefore set from the
test batch first (momentum 0, one training-mode call): a data-dependent init, not training.

Timing (2 shared cores): one preset costs 2-14 s, mostly tracing; all presets take about 60 s on ResNet50 and
50 s on MobileNetV2, over the budget of the default run. The default run therefore covers plan building on both
and two rule-heavy presets on a thin MobileNetV2; every preset on every architecture is ``slow``.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradscope.backend import keras
from gradscope.core.targets import Target
from gradscope.engine.backward.runner import Engine
from gradscope.render import degeneracy, reduce_channels
from gradscope.rules.builtin.linear_ops import gate_nodes, node_kind, readout_min_size
from gradscope.rules.methods import available_methods, build_method

#: name -> (input size, constructor options). Sizes are the smallest each constructor accepts (InceptionV3: 75).
ARCHS = {
    "ResNet50": (32, {}),
    "MobileNetV2": (32, {"alpha": 0.35}),
    "EfficientNetB0": (32, {}),
    "DenseNet121": (32, {}),
    "InceptionV3": (75, {}),
    "ConvNeXtTiny": (32, {}),
}
FAST = ("ResNet50", "MobileNetV2")
_ENGINES: dict[str, tuple[Engine, np.ndarray]] = {}


def zoo_engine(name: str) -> tuple[Engine, np.ndarray]:
    if name not in _ENGINES:
        size, options = ARCHS[name]
        keras.utils.set_random_seed(0)
        model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=7, **options)
        x = np.random.default_rng(0).uniform(0, 255, (2, size, size, 3)).astype("float32")
        batchnorms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
        for layer in batchnorms:
            layer.momentum = 0.0
        if batchnorms:
            model(x, training=True)  # moving statistics := this batch's (see the module docstring)
        _ENGINES[name] = (Engine(model), x)
    return _ENGINES[name]


#: Presets with a rule per layer kind (the others change only ReLUs, or nothing, and keep every other gradient).
LAYERWISE = ("mwp", "cmwp", "lrp_epsilon", "lrp_alpha_beta", "lrp_zplus")


def check_reports(name: str, method) -> None:
    """A layer-wise preset names every node it has no rule for (there are none on plain CNNs)."""
    if method.warnings:
        print(f"{name} {method.name}: {' | '.join(method.warnings)}")
    if method.name not in LAYERWISE:
        return
    engine, _ = zoo_engine(name)
    gates = gate_nodes(engine.graph)  # squeeze-and-excitation products: handled by signal_take_all
    unknown = [n.id for n in engine.graph.nodes if node_kind(n) == "unknown" and n.id not in gates]
    text = " ".join(method.warnings)
    assert set(gates) <= set(method.changed)
    for node_id in unknown:
        assert node_id in text, f"{name}/{method.name}: unhandled node {node_id} not reported"
    assert not set(unknown) & set(method.changed)


def run_preset(name: str, method_name: str) -> np.ndarray:
    engine, x = zoo_engine(name)
    method = build_method(method_name, engine.graph)
    check_reports(name, method)
    node = method.readout_node
    result = engine.backward(x, Target(), method.plan, capture=[node] if node else (), stats=False)
    signal = result.node_grads[node] if node else result.input_grad
    forward = result.node_values[node] if node else result.inputs[0]
    if method.times_input:
        signal = signal * forward
    maps = reduce_channels(signal, method.reduction)
    assert maps.shape[0] == len(x) and maps.ndim == 3, maps.shape
    assert np.isfinite(signal).all(), f"{name}/{method_name}: non-finite signal"
    for m in maps:  # informative, or reported as degenerate (never a silent blank picture)
        assert (np.ptp(m) > 0) == (degeneracy(m) is None), (name, method_name, degeneracy(m))
    return maps


@pytest.mark.parametrize("name", FAST)
def test_presets_plan_the_whole_architecture(name):
    """Every preset builds on the architecture; the layer-wise ones change every non-ReLU layer and warn of none."""
    engine, _ = zoo_engine(name)
    graph = engine.graph
    for method_name in available_methods():
        method = build_method(method_name, graph)
        check_reports(name, method)
        resolution = method.plan.resolve(graph)
        assert not resolution.unmatched and not resolution.skipped, method_name
    mwp = build_method("mwp", graph)
    kinds = {node_kind(graph.node(i)) for i in mwp.changed}
    assert {"linear", "batchnorm", "sum", "avg_pool"} <= kinds and "relu" not in kinds and not mwp.warnings
    cmwp = build_method("cmwp", graph)
    # the last block's output under the GAP, or (at these small inputs, where it is 1x1-3x3) the first block
    # output above it whose map is at least readout_min_size on each side
    readout = graph.node(cmwp.readout_node)
    assert cmwp.readout_node in {"conv5_block3_out", "out_relu"} or (
        min(readout.output_shape[1:3]) >= readout_min_size(graph) and not readout.op_type.startswith("ZeroPadding")
    ), cmwp.readout_node


@pytest.mark.parametrize("method_name", ["cmwp", "lrp_alpha_beta"])
def test_rule_heavy_presets_on_mobilenet(method_name):
    maps = run_preset("MobileNetV2", method_name)
    if method_name == "cmwp":
        assert maps.min() >= 0  # max(Σ_c Δ, 0): non-negative by construction; all-zero is possible


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ARCHS))
def test_every_preset_gives_finite_maps(name):
    for method_name in available_methods():
        run_preset(name, method_name)
