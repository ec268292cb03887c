"""Walk a Keras model into an executable list of steps and a ``LayerGraph``.

This is the ONLY module that touches Keras's private graph API (``_nodes_by_depth``, ``node.arguments``,
``Sequential._functional``); when Keras changes, this is the one place to mend.

Execution mirrors ``keras.src.ops.function.Function._run_through_graph`` (deepest nodes first, values kept in a
dict keyed by ``id(KerasTensor)``), with three additions: nested models are inlined so their layers are nodes
too, fused ``activation=`` arguments are split off into their own node, and every step knows its node id.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradscope.backend import check_keras_internals, keras
from gradscope.core.errors import GraphError
from gradscope.core.graph import ATTENTION_HEADS, KEPT_WHOLE, PRE_SUFFIX, LayerGraph, NodeSpec, Shape

#: Layer classes whose ``activation=`` is applied last and can be split off bit-exactly.
_FUSED_ACTIVATION_BASES = (
    "Dense",
    "BaseConv",
    "BaseConvTranspose",
    "BaseDepthwiseConv",
    "BaseSeparableConv",
)


@dataclass
class Step:
    """One unit of work in the forward pass.

    kind: ``"call"`` (a layer/operation call), ``"activation"`` (a fused activation split off a layer) or
    ``"alias"`` (feeds a nested model's inputs/outputs; no computation, no node).
    """

    kind: str
    node_id: str | None
    operation: Any = None
    arguments: Any = None  # keras SymbolicArguments, for "call"
    in_keys: list[Any] = field(default_factory=list)
    out_keys: list[Any] = field(default_factory=list)
    linear_call: bool = False  # run the layer with its activation set to linear (it was split off)


@dataclass
class ExecGraph:
    """Steps in execution order plus the plain-data graph they implement."""

    steps: list[Step]
    graph: LayerGraph
    input_keys: list[int]
    output_keys: list[Any]
    #: node id -> output keys, to capture a node's output values during the forward pass
    node_out_keys: dict[str, list[Any]]
    #: node id -> keras Layer/Operation (activation nodes map to the layer they were split from)
    operations: dict[str, Any]
    #: the node producing each model output, in output order (two outputs may come from one node)
    output_nodes: list[str] = field(default_factory=list)


def activation_name(fn: Any) -> str:
    """A readable name for a Keras activation callable (``relu``, ``sigmoid``, ...)."""
    if fn is None:
        return "linear"
    try:
        name = keras.activations.serialize(fn)
        if isinstance(name, dict):
            name = name.get("config", {}).get("name") or name.get("class_name", "custom")
        return str(name)
    except Exception:  # a custom callable
        return getattr(fn, "__name__", type(fn).__name__)


def layer_activation(op: Any) -> str | None:
    """Activation implemented by a standalone activation layer, or None for other operations."""
    cls = type(op).__name__
    if cls == "Activation":
        return activation_name(op.activation)
    if cls == "ReLU":
        plain = not op.negative_slope and not op.threshold
        if plain and op.max_value is None:
            return "relu"
        if plain and op.max_value is not None and float(op.max_value) == 6.0:
            return "relu6"
        return "relu_custom"
    return {
        "LeakyReLU": "leaky_relu",
        "ELU": "elu",
        "PReLU": "prelu",
        "Softmax": "softmax",
    }.get(cls)


#: keras.ops activations (``ops.silu(x)``, ``keras.activations.gelu(x, approximate=True)`` inside a layer's call),
#: by their operation class, named as the layers name them: rules for activations apply to them too.
_OP_ACTIVATIONS = {
    "Silu": "silu",
    "Swish": "silu",
    "Gelu": "gelu",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
    "Softplus": "softplus",
    "Elu": "elu",
    "Selu": "selu",
    "Mish": "mish",
}


def op_activation(op: Any) -> str | None:
    """The activation a ``keras.ops`` operation node computes (None for other operations)."""
    name = _OP_ACTIVATIONS.get(type(op).__name__)
    if name == "gelu" and getattr(op, "approximate", False):
        return "gelu_approximate"
    return name


def fused_activation(op: Any) -> str | None:
    """Name of a fused ``activation=`` that should be split off ``op`` (None when linear or not splittable)."""
    if not any(c.__name__ in _FUSED_ACTIVATION_BASES for c in type(op).__mro__):
        return None
    fn = getattr(op, "activation", None)
    if fn is None or fn is keras.activations.linear:
        return None
    return activation_name(fn)


@contextlib.contextmanager
def linear_activation(layer: Any) -> Iterator[None]:
    """Temporarily run ``layer`` without its fused activation; always restores (the user's model is unchanged)."""
    saved = layer.activation
    layer.activation = keras.activations.linear
    try:
        yield
    finally:
        layer.activation = saved


def _functional_of(model: Any) -> Any:
    """The Functional graph behind a model, or None for subclassed models (run as one opaque node)."""
    if type(model).__name__ == "Sequential" or hasattr(model, "_functional"):
        functional = getattr(model, "_functional", None)
        if functional is None:
            raise GraphError(f"Sequential model {model.name!r} is not built: give it an Input or call it on data once.")
        return functional
    if hasattr(model, "_nodes_by_depth") and hasattr(model, "_inputs") and model._inputs:
        return model
    return None


def _trace_subclassed(model: Any) -> tuple[Any, list[Any], tuple[str, ...]]:
    """A subclassed model as a graph of its own layers: its ``call`` run on symbolic inputs of the shape it was
    built with records a functional graph of the same layer objects (and ``keras.ops``), so rules apply per
    layer and the weights are the model's. A ``call`` that cannot run symbolically (Python branches on tensor
    values, ...) leaves the model as one opaque node, and the note says why. Returns (functional or None,
    symbolic inputs, notes)."""
    inputs = _symbolic_inputs(model)
    structure = inputs[0] if len(inputs) == 1 else inputs
    try:
        outputs = model.call(structure)
        functional = keras.Model(structure, outputs, name=model.name)
    except Exception as exc:  # noqa: BLE001 - any failure of user code means: run it whole
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        note = (
            f"Subclassed model {model.name!r}: its call() could not run on symbolic inputs ({reason[:200]}), so "
            "it is one node: its gradient flow is exact but rules cannot be set inside it. Build it from Keras "
            "layers and keras.ops (no Python branches on tensor values) to see its layers."
        )
        return None, inputs, (note,)
    note = f"Subclassed model {model.name!r}: its call() was traced on symbolic inputs; the nodes are its layers."
    return functional, list(functional.inputs), (note,)


def _is_composite(op: Any) -> bool:
    """A ``Layer`` (not a model) made of other layers, defined outside Keras. Keras's own composites
    (MultiHeadAttention, RNNs, wrappers) stay whole: rules address them as one layer, or they run exactly; so do
    attention layers (keras_hub's ``LlamaAttention``, ``CachedGemmaAttention``...: the attention rules re-run
    them whole, rotary embeddings, grouped heads, soft-capping and sliding windows included)."""
    if isinstance(op, keras.Model) or not isinstance(op, keras.layers.Layer):
        return False
    if type(op).__module__.split(".")[0] == "keras" or is_attention_layer(op) or is_expert_mixture(op):
        return False
    return any(True for _ in op._flatten_layers(include_self=False, recursive=False))


def is_attention_layer(op: Any) -> bool:
    """An attention layer (``MultiHeadAttention`` and its subclasses, keras_hub's ``*Attention`` layers)."""
    return isinstance(op, keras.layers.Layer) and any(c.__name__.endswith("Attention") for c in type(op).__mro__)


def is_expert_mixture(op: Any) -> bool:
    """A sparse mixture-of-experts block (keras_hub's ``MixtralSparseMoeBlock``, ``Qwen3SparseMoeBlock``): kept
    one node. Its call reshapes by the batch and sequence length it reads with ``ops.shape``, which a symbolic
    run records as unknown; the ``expert_mixture`` rules re-run it whole (router held constant)."""
    return isinstance(op, keras.layers.Layer) and any(c.__name__.endswith("MoeBlock") for c in type(op).__mro__)


class DeferredMask(keras.Operation):
    """A block's own mask computation (``_compute_self_attention_mask`` of keras_hub's decoder blocks: causal,
    padding, sliding window) as one operation of the opened block's graph. Those methods build ``ops.arange``
    of the sequence length, which a symbolic run with a free length cannot: deferred, it runs on the real
    tensors at every call (any length), and Keras traces its output spec with dynamic shapes."""

    def __init__(self, method: Any, args: list, kwargs: dict, name: str | None = None) -> None:
        super().__init__(name=name)
        self.method, self.template = method, (args, kwargs)

    def call(self, *tensors: Any) -> Any:
        given = iter(tensors)
        args, kwargs = self.template
        fill = [next(given) if a is _HOLE else a for a in args]
        return self.method(*fill, **{k: next(given) if v is _HOLE else v for k, v in kwargs.items()})


_HOLE = object()  # where a DeferredMask's call takes one of its tensors


#: A layer's plain attributes that name it rather than say what it computes.
_NAMING = frozenset({"name", "_name", "_path", "_parent_path", "_called", "_self_update_uid"})


def _spec_key(layer: Any, args: tuple, kwargs: dict) -> Any:
    """What an attention layer's output spec depends on: its class, dtype policy, plain attributes (heads, rotary
    settings: keras_hub's ``LlamaAttention.get_config`` itself fails) but its names, its weights' shapes, and its
    arguments' shapes and dtypes (plain values as they are); None where an argument is neither (no spec shared)."""

    def part(value: Any) -> Any:
        if isinstance(value, keras.KerasTensor):
            return ("tensor", tuple(value.shape), str(value.dtype), value.sparse, value.ragged)
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError

    try:
        arguments = tuple(part(a) for a in args), tuple(sorted((k, part(v)) for k, v in kwargs.items()))
    except TypeError:
        return None
    plain = (bool, int, float, str, type(None))
    attributes = sorted((k, v) for k, v in vars(layer).items() if k not in _NAMING and isinstance(v, plain))
    weights = tuple((tuple(w.shape), str(w.dtype)) for w in layer.weights)
    return type(layer), str(getattr(layer.dtype_policy, "name", "")), repr(attributes), weights, arguments


def _fresh(spec: Any) -> Any:
    """New KerasTensors of ``spec``'s shapes (a traced spec's tensors become one layer call's outputs)."""
    return keras.tree.map_structure(
        lambda t: keras.KerasTensor(t.shape, dtype=t.dtype, sparse=t.sparse, ragged=t.ragged), spec
    )


@contextlib.contextmanager
def _symbolic_friendly(op: Any, specs: dict) -> Iterator[None]:
    """While a block's call runs symbolically: its ``_compute...mask...`` methods return a ``DeferredMask``, and
    its attention layers' output specs ignore the ``None`` cache arguments keras_hub passes them
    (``MultiHeadAttention.compute_output_spec`` refuses ``cache=`` that ``CachedMultiHeadAttention.call``
    takes), and come from tracing their call where their own spec fails (SmolLM3's ``compute_output_shape``
    reads a list of shapes it is not given). An attention layer's spec is traced once per config and input shapes
    (``specs``, kept by the walk): a 1 B Llama's 16 alike layers took 0.15 s each."""
    names = [n for n in dir(type(op)) if n.startswith("_compute") and "mask" in n and callable(getattr(op, n))]
    attentions = [
        layer for layer in op._flatten_layers(include_self=False, recursive=False) if is_attention_layer(layer)
    ]

    def deferring(method: Any) -> Any:
        def deferred(*args: Any, **kwargs: Any) -> Any:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, keras.KerasTensor)]
            if not tensors:
                return method(*args, **kwargs)
            hole = lambda a: _HOLE if isinstance(a, keras.KerasTensor) else a  # noqa: E731
            return DeferredMask(
                method, [hole(a) for a in args], {k: hole(v) for k, v in kwargs.items()}, name="attention_mask"
            )(*tensors)

        return deferred

    def lenient(layer: Any) -> Any:
        spec = layer.compute_output_spec
        accepted = inspect.signature(spec).parameters

        def output_spec(*args: Any, **kwargs: Any) -> Any:
            if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
                kwargs = {k: v for k, v in kwargs.items() if k in accepted or v is not None}
            key = _spec_key(layer, args, kwargs)
            if key is not None and key in specs:
                return _fresh(specs[key])
            try:
                found = spec(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a wrong compute_output_shape (SmolLM3's): trace the call itself
                found = keras.src.backend.compute_output_spec(layer.call, *args, **kwargs)
            if key is not None:
                specs[key] = found
            return found

        return output_spec

    for name in names:
        object.__setattr__(op, name, deferring(getattr(op, name)))
    for layer in attentions:
        object.__setattr__(layer, "compute_output_spec", lenient(layer))
    try:
        yield
    finally:
        for name in names:
            object.__delattr__(op, name)
        for layer in attentions:
            object.__delattr__(layer, "compute_output_spec")


def _has_implicit_mask(op: Any, node: Any) -> bool:
    """Keras passes a call() that takes ``mask`` its inputs' masks unless given one; a symbolic run of the
    call would not."""
    try:
        takes_mask = "mask" in inspect.signature(op.call).parameters
    except (TypeError, ValueError):
        return True
    kwargs = node.arguments.kwargs if hasattr(node.arguments, "kwargs") else {}
    if not takes_mask or kwargs.get("mask") is not None:
        return False
    return any(getattr(t, "_keras_mask", None) is not None for t in node.input_tensors)


def _symbolic_inputs(model: Any) -> list[Any]:
    """``keras.Input``s of the shapes a subclassed model was built with (``get_build_config``)."""
    built = getattr(model, "built", False)
    shapes = ((model.get_build_config() if built else None) or {}).get("input_shape")
    if shapes is None and built:  # Keras' own symbolic build failed, so it recorded no shape
        raise GraphError(
            f"Subclassed model {model.name!r}: Keras recorded no input shape for it, because its call() cannot run "
            "on symbolic inputs (e.g. a Python `if` on a tensor value). gradscope needs a call() made of Keras "
            "layers and keras.ops, or a build(input_shape) method that builds its layers."
        )
    if shapes is None:
        raise GraphError(
            f"Model {model.name!r} is a subclassed model that was never built, so its input shape is unknown. "
            "Call it on data once (or model.build(shape)) before saving or opening it."
        )
    if isinstance(shapes, dict):
        raise GraphError(f"Model {model.name!r} takes a dict of inputs; gradscope opens tensor or list inputs.")
    nested = bool(shapes) and isinstance(shapes[0], (list, tuple))
    return [
        keras.Input(shape=tuple(shape)[1:], name=f"input_{i}" if nested else "input")
        for i, shape in enumerate(shapes if nested else [shapes])
    ]


def _symbolic_outputs(model: Any, inputs: list[Any]) -> Any:
    outputs = getattr(model, "outputs", None)
    if outputs:
        return outputs
    structure = inputs[0] if len(inputs) == 1 else inputs
    try:
        return model.compute_output_spec(structure)
    except Exception:  # noqa: BLE001 - a call() that only runs on values: run it once on zeros
        zeros = keras.tree.map_structure(lambda t: np.zeros([1, *t.shape[1:]], t.dtype), structure)
        return keras.tree.map_structure(lambda y: keras.KerasTensor((None, *y.shape[1:]), y.dtype), model(zeros))


def _shape(t: Any) -> Shape:
    return tuple(None if d is None else int(d) for d in t.shape)


def _count_params(op: Any) -> tuple[int, int]:
    try:
        total = sum(int(_size(w)) for w in op.weights)
        trainable = sum(int(_size(w)) for w in op.trainable_weights)
    except Exception:
        return 0, 0
    return total, trainable


def _size(w: Any) -> int:
    n = 1
    for d in w.shape:
        n *= int(d)
    return n


def _config_summary(op: Any) -> dict:
    """A few JSON-friendly config entries for the inspector (never the full config: it can be huge)."""
    keep: dict = {}
    # an attention layer's head count, whatever its config calls it (or whether it has one: keras_hub's Llama
    # attention's get_config fails): what the memory a long sequence needs is estimated from (LayerGraph)
    heads = [getattr(op, a, None) for a in ("num_query_heads", "num_heads", "_num_heads")]
    heads = [h for h in heads if isinstance(h, int) and not isinstance(h, bool)]
    if heads:
        keep[ATTENTION_HEADS] = heads[0]
    try:
        cfg = op.get_config()
    except Exception:
        return keep
    for k, v in cfg.items():
        if k in ("name", "dtype", "trainable") or isinstance(v, dict):
            continue
        if isinstance(v, (int, float, str, bool)) or v is None:
            keep[k] = v
        elif isinstance(v, (list, tuple)) and len(v) <= 8 and all(isinstance(e, (int, float, str)) for e in v):
            keep[k] = list(v)
    return keep


class _Builder:
    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.nodes: list[NodeSpec] = []
        self.producer: dict[Any, str] = {}  # tensor key -> node id that produced it
        self.node_out_keys: dict[str, list[Any]] = {}
        self.operations: dict[str, Any] = {}
        self.call_counts: dict[str, int] = {}
        self.groups: list[str] = []
        self.first_call: dict[int, str] = {}  # id(layer) -> id of the first node that called it
        self.notes: list[str] = []
        self.renaming = False  # inside an opened layer (see base_name)
        self.closed: dict[int, str] = {}  # id(layer) -> why a composite layer stayed one node
        self.attention_specs: dict[Any, Any] = {}  # see _symbolic_friendly

    def unique_id(self, base: str) -> str:
        k = self.call_counts.get(base, 0)
        self.call_counts[base] = k + 1
        return base if k == 0 else f"{base}#{k}"

    def add_node(self, spec: NodeSpec, op: Any, out_keys: list[Any]) -> None:
        self.nodes.append(spec)
        self.operations[spec.id] = op
        self.node_out_keys[spec.id] = out_keys
        for k in out_keys:
            self.producer[k] = spec.id

    def walk(self, functional: Any, prefix: str, group: str | None) -> None:
        depth_keys = sorted(functional._nodes_by_depth.keys(), reverse=True)
        for depth in depth_keys:
            for node in functional._nodes_by_depth[depth]:
                op = node.operation
                if op is None or node.is_input:
                    continue
                in_keys = [id(t) for t in node.input_tensors]
                if any(k not in self.producer for k in in_keys):
                    continue  # node of another graph the layer took part in
                self.visit(node, op, in_keys, prefix, group)

    def visit(self, node: Any, op: Any, in_keys: list[Any], prefix: str, group: str | None) -> None:
        out_keys = [id(t) for t in node.outputs]
        node_id = self.unique_id(prefix + self.base_name(op))
        inner = _functional_of(op) if isinstance(op, keras.Model) else self.opened(op, node)
        if inner is not None:
            self.inline_model(node, inner, node_id, in_keys, out_keys, group)
            return
        act = fused_activation(op)
        inputs = tuple(dict.fromkeys(self.producer[k] for k in in_keys))
        params, trainable = _count_params(op)
        in_shapes = tuple(_shape(t) for t in node.input_tensors)
        out_shapes = tuple(_shape(t) for t in node.outputs)
        dtype = str(node.outputs[0].dtype) if node.outputs else "float32"
        own_id = node_id if act is None else node_id + PRE_SUFFIX  # the node that calls the layer (holds its weights)
        first = self.first_call.setdefault(id(op), own_id)
        common = dict(group=group, layer_name=op.name, dtype=dtype, first_call=None if first == own_id else first)
        # `Conv2D(activation="relu", name="feat")` is two nodes: "feat:pre", the linear part, and "feat", its
        # activation, so that the layer's name reads what Keras calls its output (after the activation).
        config = _config_summary(op)
        if id(op) in self.closed:  # a composite layer run whole: rules do not reach inside (presets warn)
            config = {**config, KEPT_WHOLE: self.closed[id(op)]}
        layer_spec = NodeSpec(
            id=own_id,
            name=op.name,
            op_type=type(op).__name__,
            inputs=inputs,
            input_shapes=in_shapes,
            output_shapes=out_shapes,
            params=params,
            trainable_params=trainable,
            activation=(layer_activation(op) or op_activation(op)) if act is None else None,
            fused_activation=act,
            config=config if act is None else {**config, "activation": "linear (split off)"},
            **common,
        )
        if act is None:
            self.steps.append(Step("call", node_id, op, node.arguments, in_keys, out_keys))
            self.add_node(layer_spec, op, out_keys)
            return
        pre_id = own_id
        pre_spec = layer_spec
        mid_key = ("preact", node_id)
        self.steps.append(Step("call", pre_id, op, node.arguments, in_keys, [mid_key], linear_call=True))
        self.add_node(pre_spec, op, [mid_key])
        act_spec = NodeSpec(
            id=node_id,
            name=f"{op.name}:{act}",
            op_type="Activation",
            inputs=(pre_id,),
            input_shapes=out_shapes,
            output_shapes=out_shapes,
            activation=act,
            fused_with=pre_id,
            config={"activation": act, "fused_in": pre_id},
            **{**common, "first_call": pre_id},
        )
        self.steps.append(Step("activation", node_id, op, None, [mid_key], out_keys))
        self.add_node(act_spec, op, out_keys)

    def base_name(self, op: Any) -> str:
        """The name a node id is made of. Inside an opened layer, the ``keras.ops`` of its call were created just
        now, named by a counter of the whole process (``add_37``): they are named by their kind instead
        (``add``, then ``add#1`` in the same block), so ids do not depend on what ran before."""
        if not self.renaming or isinstance(op, (keras.layers.Layer, DeferredMask)):
            return op.name
        return re.sub(r"(?<!^)(?=[A-Z])", "_", type(op).__name__).lower()

    def opened(self, op: Any, node: Any) -> Any:
        """A composite layer of the user's or a library's (a transformer block: attention, norms and dense layers
        inside one ``Layer``) as the functional graph of its ``call`` run on symbolic copies of this call's
        inputs, so its sublayers are nodes and rules apply inside it; None to keep it one node (Keras's own
        layers, which gradscope runs whole or has rules for; a call that cannot run symbolically: noted)."""
        if not _is_composite(op):
            return None
        if _has_implicit_mask(op, node):
            self.closed[id(op)] = "it receives a Keras mask its call() would not pass on when opened"
            self.notes.append(
                f"Layer {op.name!r} ({type(op).__name__}) receives a Keras mask, which a symbolic run of its call() "
                "would not pass on: it is one node (its gradient is exact; rules cannot be set inside it)."
            )
            return None
        symbolic = {id(t): keras.Input(batch_shape=t.shape, dtype=t.dtype) for t in node.input_tensors}
        inputs = [symbolic[id(t)] for t in node.input_tensors]
        try:
            args, kwargs = node.arguments.fill_in(symbolic)
            with _symbolic_friendly(op, self.attention_specs):
                outputs = op.call(*args, **kwargs)
            inner = keras.Model(inputs, outputs, name=op.name)
            if len(inner.outputs) != len(node.outputs):
                raise GraphError(f"{len(inner.outputs)} outputs instead of {len(node.outputs)}")
        except Exception as exc:  # noqa: BLE001 - any failure of user code means: run it whole
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.closed[id(op)] = f"its call() could not run on symbolic inputs ({reason[:120]})"
            self.notes.append(
                f"Layer {op.name!r} ({type(op).__name__}): its call() could not run on symbolic inputs "
                f"({reason[:200]}), so it is one node: its gradient is exact but rules cannot be set inside it."
            )
            return None
        return inner

    def inline_model(
        self, node: Any, inner: Any, node_id: str, in_keys: list[Any], out_keys: list[Any], group: str | None
    ) -> None:
        inner_in = [id(t) for t in inner.inputs]
        if len(inner_in) != len(in_keys):
            raise GraphError(
                f"Nested model {node_id!r} takes {len(inner_in)} inputs but is called with {len(in_keys)}."
            )
        self.groups.append(node_id)
        self.steps.append(Step("alias", None, in_keys=in_keys, out_keys=inner_in))
        for src, dst in zip(in_keys, inner_in):
            self.producer[dst] = self.producer[src]
        # Fresh call counts per inlined copy: ids inside are relative to the nested model's node id.
        saved, self.call_counts = self.call_counts, {}
        renaming, self.renaming = self.renaming, self.renaming or not isinstance(node.operation, keras.Model)
        self.walk(inner, node_id + "/", node_id)
        self.call_counts, self.renaming = saved, renaming
        inner_out = [id(t) for t in inner.outputs]
        self.steps.append(Step("alias", None, in_keys=inner_out, out_keys=out_keys))
        for src, dst in zip(inner_out, out_keys):
            self.producer[dst] = self.producer[src]


def build_exec_graph(model: Any) -> ExecGraph:
    """Build the executable steps and the ``LayerGraph`` of ``model`` (never modifies the model)."""
    if not isinstance(model, keras.Model):
        raise GraphError(f"Expected a keras.Model, got {type(model).__name__}.")
    check_keras_internals()  # a Keras that moved them would make every model one opaque node
    b = _Builder()
    functional = _functional_of(model)
    notes: tuple[str, ...] = ()
    model_inputs = functional.inputs if functional is not None else getattr(model, "inputs", None)
    if functional is None and not model_inputs:
        functional, model_inputs, notes = _trace_subclassed(model)
    input_keys = []
    for t in model_inputs:
        layer = t._keras_history[0]
        node_id = b.unique_id(layer.name)
        spec = NodeSpec(
            id=node_id,
            name=layer.name,
            op_type="InputLayer",
            inputs=(),
            input_shapes=(),
            output_shapes=(_shape(t),),
            dtype=str(t.dtype),
            layer_name=layer.name,
            is_input=True,
        )
        b.add_node(spec, layer, [id(t)])
        input_keys.append(id(t))
    if functional is not None:
        b.walk(functional, "", None)
        output_keys: list[Any] = [id(t) for t in functional.outputs]
    else:  # subclassed model: one opaque node
        out_keys = [("model_out", model.name)]
        spec = NodeSpec(
            id=b.unique_id(model.name),
            name=model.name,
            op_type=type(model).__name__,
            inputs=tuple(b.producer[k] for k in input_keys),
            input_shapes=tuple(_shape(t) for t in model_inputs),
            output_shapes=tuple(_shape(t) for t in keras.tree.flatten(_symbolic_outputs(model, model_inputs))),
            dtype="float32",
            params=_count_params(model)[0],
            trainable_params=_count_params(model)[1],
        )
        b.steps.append(Step("model", spec.id, model, None, list(input_keys), out_keys))
        b.add_node(spec, model, out_keys)
        output_keys = out_keys
    missing = [k for k in output_keys if k not in b.producer]
    if missing:
        raise GraphError(f"Model {model.name!r}: {len(missing)} output(s) are not connected to its inputs.")
    output_ids = tuple(dict.fromkeys(b.producer[k] for k in output_keys))
    nodes = tuple(NodeSpec(**{**n.__dict__, "is_output": True}) if n.id in output_ids else n for n in b.nodes)
    graph = LayerGraph(
        nodes=nodes,
        input_ids=tuple(b.producer[k] for k in input_keys),
        output_ids=output_ids,
        model_name=model.name,
        groups=tuple(b.groups),
        notes=(*notes, *b.notes),
    )
    output_nodes = [b.producer[k] for k in output_keys]
    return ExecGraph(b.steps, graph, input_keys, output_keys, b.node_out_keys, b.operations, output_nodes)
