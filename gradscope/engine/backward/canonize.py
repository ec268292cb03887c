"""Canonizers: plan-independent views of a model that never modify the user's model.

- Split fused activations: done by the graph walk itself (``Conv2D(activation="relu")`` is the nodes ``conv:pre``, the
  linear part, and ``conv``, its activation and output; bit-exact); ``split_activations`` returns that view.
- Strip the final softmax: the Engine explains the logits (``Engine(strip_softmax=True)``); ``final_softmax``
  names the node it skips and ``strip_softmax`` builds the same thing as a separate model.
- Fold inference BatchNorm into the preceding Dense/Conv (RULES_SPEC §2.3/§2.5, zennit's canonizer route):
  ``fold_batchnorm`` builds a *clone* with ``W' = a·W``, ``b' = a·(b − μ) + β``, ``a = γ/√(σ² + ε)`` and the BN
  replaced by a ``RemovedLayer`` (identity) of the same name, so node ids (and plans) stay valid.

Models are copied with the public ``keras.models.clone_model``; weights are copied layer by layer, so the copy
shares no variable with the original.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gradscope.backend import keras
from gradscope.core.errors import GraphError
from gradscope.core.graph import LayerGraph
from gradscope.engine.backward.keras_graph import build_exec_graph

#: Layers a following BatchNorm can be folded into, with the axis of their kernel that indexes output channels.
_FOLD_KERNEL_AXIS = {
    "Dense": -1,
    "Conv1D": -1,
    "Conv2D": -1,
    "Conv3D": -1,
    "Conv1DTranspose": -2,
    "Conv2DTranspose": -2,
    "Conv3DTranspose": -2,
    "DepthwiseConv1D": None,  # (k..., in, multiplier): output channel = in * multiplier + m
    "DepthwiseConv2D": None,
    "SeparableConv1D": -1,  # the pointwise kernel
    "SeparableConv2D": -1,
}


@keras.saving.register_keras_serializable(package="gradscope")
class RemovedLayer(keras.layers.Layer):
    """Stands in for a layer a canonizer removed (a folded BatchNorm, a stripped softmax): returns its input.

    Keeps the removed layer's name, so node ids and plans stay valid; ``was`` is the removed layer's class. It
    accepts the ``mask``/``training`` arguments the removed layer was called with.
    """

    def __init__(self, was: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.was = was

    def call(self, inputs: Any, mask: Any = None, training: Any = None) -> Any:
        return inputs

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "was": self.was}


def _removed(layer: Any) -> RemovedLayer:
    return RemovedLayer(was=type(layer).__name__, name=layer.name, dtype=layer.dtype_policy)


# ------------------------------------------------------------------------------------------------ split view
def split_activations(model: Any) -> LayerGraph:
    """The graph with every fused ``activation=`` as its own node, ``<id>`` after ``<id>:pre`` (the engine's view)."""
    return build_exec_graph(model).graph


# ------------------------------------------------------------------------------------------------ softmax
def final_softmax(graph: LayerGraph) -> str | None:
    """Id of the softmax node that produces the (first) model output, or None. The Engine explains its input."""
    node = graph.node(graph.output_ids[0])
    return node.id if node.activation == "softmax" else None


def strip_softmax(model: Any) -> tuple[Any, str | None]:
    """A copy of ``model`` that outputs the logits: the final softmax becomes linear (fused) or a
    ``RemovedLayer`` (identity).

    Returns ``(copy, softmax node id)``; when there is no final softmax, ``(model, None)`` (nothing to copy).
    """
    ex = build_exec_graph(model)
    node_id = final_softmax(ex.graph)
    if node_id is None:
        return model, None
    layer = ex.operations[node_id]
    if len(_layer_nodes(ex).get(id(layer), [])) > 1:
        raise GraphError(f"The final softmax layer {layer.name!r} is shared by several calls; cannot strip it alone.")
    fused = ex.graph.node(node_id).fused_with is not None

    def replace(orig: Any) -> Any | None:
        if orig is not layer:
            return None
        if fused:
            return type(orig).from_config({**orig.get_config(), "activation": "linear"})
        return _removed(orig)

    return _clone(model, replace, {}), node_id


# ------------------------------------------------------------------------------------------------ BatchNorm
def foldable_batchnorms(model: Any) -> tuple[dict[str, str], dict[str, str]]:
    """Which BatchNorm nodes ``fold_batchnorm`` folds: ``({bn id: linear node id}, {bn id: why not})``."""
    ex = build_exec_graph(model)
    graph = ex.graph
    calls = _layer_nodes(ex)
    folds: dict[str, str] = {}
    refused: dict[str, str] = {}
    for node in graph.nodes:
        if node.op_type != "BatchNormalization":
            continue
        bn = ex.operations[node.id]
        parent = graph.node(node.inputs[0]) if len(node.inputs) == 1 else None
        reason = None
        if parent is None or parent.op_type not in _FOLD_KERNEL_AXIS:
            kind = parent.op_type if parent is not None else "several inputs"
            reason = f"its input comes from {kind}, not a Dense/Conv layer without activation"
        elif [c.id for c in graph.children(parent.id)] != [node.id]:
            reason = f"the output of {parent.id!r} is also used elsewhere"
        elif len(calls[id(bn)]) > 1 or len(calls[id(ex.operations[parent.id])]) > 1:
            reason = "a shared layer (called more than once)"
        elif {v.name for v in ex.operations[parent.id].weights} - {*_kernel_names(ex.operations[parent.id]), "bias"}:
            reason = f"{parent.id!r} has extra weights (LoRA or quantization)"
        elif not _channel_axis_matches(ex.operations[parent.id], bn, len(node.output_shape)):
            reason = "BatchNorm does not normalise the layer's channel axis"
        if reason:
            refused[node.id] = reason
        else:
            folds[node.id] = parent.id
    return folds, refused


def fold_batchnorm(model: Any) -> tuple[Any, dict[str, str]]:
    """A copy of ``model`` with every foldable inference BatchNorm merged into the Dense/Conv before it.

    Returns ``(copy, {bn node id: linear node id})``. The copy computes the same function (to float rounding);
    the BN node keeps its id as a ``RemovedLayer`` (identity). The user's model and its weights are not touched.
    When nothing can be folded, returns ``(model, {})``. See ``foldable_batchnorms`` for why a BN was kept.
    """
    folds, _ = foldable_batchnorms(model)
    if not folds:
        return model, {}
    ex = build_exec_graph(model)
    bn_of_linear = {id(ex.operations[lin]): ex.operations[bn] for bn, lin in folds.items()}
    bns = {id(ex.operations[bn]) for bn in folds}
    new_weights: dict[int, list[np.ndarray]] = {}

    def replace(orig: Any) -> Any | None:
        if id(orig) in bns:
            return _removed(orig)
        bn = bn_of_linear.get(id(orig))
        if bn is None:
            return None
        new_weights[id(orig)] = _folded_weights(orig, bn)
        return type(orig).from_config({**orig.get_config(), "use_bias": True})

    return _clone(model, replace, new_weights), folds


def _folded_weights(layer: Any, bn: Any) -> list[np.ndarray]:
    """The weights of ``layer`` (kernels in order, then the bias) with ``bn`` folded in, computed in float64."""
    cls = type(layer).__name__
    values = dict(zip((v.name for v in layer.weights), layer.get_weights()))
    dtype = values[_kernel_names(layer)[-1]].dtype
    mean, var = _np(bn.moving_mean), _np(bn.moving_variance)
    gamma = _np(bn.gamma) if bn.scale else np.ones_like(mean)
    beta = _np(bn.beta) if bn.center else np.zeros_like(mean)
    a = gamma / np.sqrt(var + bn.epsilon)
    bias = np.asarray(values["bias"], np.float64) if "bias" in values else np.zeros_like(mean)
    kernels = [np.asarray(values[n], np.float64) for n in _kernel_names(layer)]
    k = kernels[-1]  # the kernel whose output channels the BN scales (pointwise for SeparableConv)
    if cls.startswith("Depthwise"):  # (..., in, multiplier): output channel = in * multiplier + m
        kernels[-1] = k * a.reshape(k.shape[-2], k.shape[-1])
    else:
        shape = [1] * k.ndim
        shape[_FOLD_KERNEL_AXIS[cls]] = -1
        kernels[-1] = k * a.reshape(shape)
    return [w.astype(dtype) for w in (*kernels, a * (bias - mean) + beta)]


def _kernel_names(layer: Any) -> list[str]:
    if type(layer).__name__.startswith("Separable"):
        return ["depthwise_kernel", "pointwise_kernel"]
    return ["kernel"]


def _np(variable: Any) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(variable), np.float64)


def _channel_axis_matches(layer: Any, bn: Any, rank: int) -> bool:
    axis = bn.axis if isinstance(bn.axis, int) else (bn.axis[0] if len(bn.axis) == 1 else None)
    if axis is None:
        return False
    axis = axis % rank
    channels_first = getattr(layer, "data_format", "channels_last") == "channels_first"
    return axis == (1 if channels_first else rank - 1)


# ------------------------------------------------------------------------------------------------ cloning
def _layer_nodes(ex: Any) -> dict[int, list[str]]:
    """id(layer) -> its node ids (split activations excluded: they are the same call as their ``:pre`` node)."""
    calls: dict[int, list[str]] = {}
    for node in ex.graph.nodes:
        if node.is_input or node.fused_with is not None:
            continue
        calls.setdefault(id(ex.operations[node.id]), []).append(node.id)
    return calls


def _clone(model: Any, replace: Callable[[Any], Any | None], weights: dict[int, list[np.ndarray]]) -> Any:
    """``clone_model`` (recursing into nested models) with ``replace(layer)`` deciding per layer (None: a plain
    copy); then every copied layer gets the original's weights, and replaced ones ``weights[id(original)]``."""
    pairs: list[tuple[Any, Any]] = []

    def clone_function(layer: Any) -> Any:
        new = replace(layer)
        if new is None:
            new = type(layer).from_config(layer.get_config())
        pairs.append((layer, new))
        return new

    try:
        copy = keras.models.clone_model(model, clone_function=clone_function, recursive=True)
    except Exception as exc:
        raise GraphError(f"Cannot copy model {model.name!r} to canonize it: {type(exc).__name__}: {exc}") from exc
    for orig, new in pairs:
        values = weights.get(id(orig))
        if values is None:
            if isinstance(new, RemovedLayer) and not isinstance(orig, RemovedLayer):
                continue  # a removed BatchNorm / softmax: nothing to copy
            values = orig.get_weights()
        if values:
            new.set_weights(values)
    return copy
