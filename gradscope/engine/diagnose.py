"""Gradient diagnostics: where gradients stop (path diagnostics) and how they flow per layer (gradient flow).

Path diagnostics (``diagnose_model``), two levels, both from ONE trace of the engine's forward pass:

1. ``tape.gradient(target, trainable_variables, unconnected_gradients=NONE)`` plus ``tape.watched_variables()``
   sorts every trainable variable into *connected*, *read but blocked* and *never read*.
2. The traced graph is walked from each variable's reads (consumers of its resource handle) forward along
   data edges, plus ``AssignVariableOp -> ReadVariableOp`` on the same resource (a state write feeds later
   reads *without* a gradient). Where the differentiable part of the walk ends but the data still reaches the
   target sits the op that cuts the path: a state write (``assign`` / ``set_weights``), ``StopGradient``, an
   op with no gradient (``tf.numpy_function`` -> ``PyFunc``), or an integer/rounded value (``ArgMax``,
   ``Cast`` to int, ``Round``, ``Floor``: these have registered gradients that return None, so the registry
   alone is not enough; dtypes are checked too).

Graph ops are mapped to gradscope node ids by *when they were created*: the engine's node loop reports each
node before running it, so op ``k`` belongs to the last node reported before it. This is exact, unlike op
names (TF uniquifies name scopes: a layer called twice gives ``dense/`` and ``dense_1/``, which may also be
another layer's name).

Gradient flow (``gradient_flow``): per-node activation-gradient statistics and per-layer weight statistics of
one backward pass (usually of a training loss), with vanishing / exploding / dead-ReLU flags; see
``FlowThresholds`` for the defaults and why.
"""

from __future__ import annotations

import csv
import math
import re
import time
from bisect import bisect_right
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.backend import keras, tf
from gradscope.core.errors import GraphError
from gradscope.core.targets import Target
from gradscope.engine import loss_targets

# ------------------------------------------------------------------------------------------------ op classes
#: Ops that write a variable: the written value reaches later reads, its gradient does not.
_STATE_WRITE_PREFIXES = ("Assign", "ResourceScatter", "ResourceApply", "ResourceSparseApply", "ScatterNd")
_STOP_OPS = frozenset({"StopGradient", "PreventGradient"})
#: Float -> float ops whose registered gradient returns None (the registry says "differentiable").
_NONE_GRAD_FLOAT_OPS = frozenset({"Round", "Rint", "Floor", "Ceil", "FloorDiv", "TruncateDiv"})
#: Ops a user writes on purpose that turn a float into an integer (named in the report as "integer path").
_NAMED_INTEGER_OPS = frozenset({"ArgMax", "ArgMin", "Cast", "Bucketize", "TopKV2", "Round", "Rint", "Floor", "Ceil"})
#: Shape bookkeeping: reading a tensor's shape never carries a gradient and never is the bug.
_META_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastArgs", "BroadcastGradientArgs"})
_NOT_READS = frozenset({"VarIsInitializedOp", "DestroyResourceOp", "VarHandleOp"})

#: Cut kinds, most telling first (when a path is cut in several places the first kind is reported).
CUT_KINDS = ("state_write", "stop_gradient", "no_gradient", "integer", "comparison", "shape")

_FIXES = {
    "state_write": (
        "Pass the predicted weights as tensors instead of writing them into a variable: compute the layer with "
        "keras.ops.matmul / keras.ops.conv on the predicted kernel, or call it with "
        "layer.stateless_call([kernel, bias], [], x). assign() / set_weights() store a value; gradients do not "
        "flow through stored state."
    ),
    "stop_gradient": (
        "Remove the stop_gradient (keras.ops.stop_gradient / tf.stop_gradient) if the layers before it should "
        "learn; if it is meant (a frozen branch), these variables get no gradient by design."
    ),
    "no_gradient": (
        "This op has no gradient (tf.numpy_function, a custom op): write it with keras.ops / tf ops, or wrap it "
        "in tf.custom_gradient to define its backward pass."
    ),
    "integer": (
        "The value becomes an integer (or is rounded), whose derivative is zero/undefined. Use a differentiable "
        "relaxation (softmax instead of argmax, keep floats instead of casting) or a straight-through estimator "
        "(x + stop_gradient(round(x) - x))."
    ),
    "comparison": (
        "The value only enters a comparison (a boolean), which has no gradient. Use a smooth function of the "
        "value (sigmoid, softmax) where the result should depend on it differentiably."
    ),
    "shape": "Only the tensor's shape is used, which has no gradient.",
}

_STATUS_WORDS = {
    "connected": "receives a gradient",
    "blocked": "is read, but its gradient is cut",
    "unused": "is read, but its value never reaches the target",
    "never_read": "is never read in the forward pass",
}


def _is_state_write(op_type: str) -> bool:
    return op_type.startswith(_STATE_WRITE_PREFIXES) and op_type not in ("Assert",)


def _differentiable_dtype(dtype: Any) -> bool:
    return bool(dtype.is_floating or dtype.is_complex or dtype == tf.variant)


def _passes_gradient(op: Any) -> bool:
    """Whether gradients flow from a float input of ``op`` to its float outputs (registry + known exceptions)."""
    if op.type in _STOP_OPS or op.type in _NONE_GRAD_FLOAT_OPS or _is_state_write(op.type):
        return False
    from tensorflow.python.framework import ops as tf_ops  # the gradient registry has no public accessor

    try:
        return tf_ops.get_gradient_function(op) is not None
    except LookupError:
        return False


def _cut_kind(op: Any) -> str:
    if _is_state_write(op.type):
        return "state_write"
    if op.type in _STOP_OPS:
        return "stop_gradient"
    if op.type in _META_OPS:
        return "shape"
    if op.type in _NAMED_INTEGER_OPS:
        return "integer"
    float_out = any(_differentiable_dtype(o.dtype) for o in op.outputs)
    if not _passes_gradient(op) and float_out:
        return "no_gradient"
    if any(o.dtype == tf.bool for o in op.outputs):
        return "comparison"
    return "integer"


# ------------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class Cut:
    """The op where a gradient path is cut, and where it sits in the model."""

    op_name: str
    op_type: str
    kind: str  # one of CUT_KINDS
    node: str | None  # gradscope node id that created the op (None: the target/loss computation)
    layer: str | None  # Keras layer name of that node
    reason: str  # plain words
    fix: str
    writes_variable: str | None = None  # for a state write: the variable written

    def where(self) -> str:
        if self.node is None:
            return "the target computation"
        layer = f" (layer {self.layer})" if self.layer and self.layer != self.node else ""
        return f"node {self.node!r}{layer}"


@dataclass(frozen=True)
class VariableDiagnosis:
    """What happens to one trainable variable on the way to the target."""

    path: str  # Keras variable path, e.g. "hyper_head/kernel"
    shape: tuple[int, ...]
    node: str | None  # node id that owns / first reads the variable
    layer: str | None
    status: str  # connected | blocked | unused | never_read
    cut: Cut | None = None
    path_nodes: tuple[str, ...] = ()  # node ids from the variable's node to the cut (for the graph view)
    path_ops: tuple[str, ...] = ()  # TF op names of the same path
    other_cuts: tuple[str, ...] = ()  # further ops cutting other paths of the same variable ("op (kind)")
    note: str = ""

    @property
    def connected(self) -> bool:
        return self.status == "connected"

    def message(self) -> str:
        head = f"{self.path}{_shape_text(self.shape)} of {self.node!r} {_STATUS_WORDS[self.status]}"
        if self.status == "blocked" and self.cut is not None:
            via = " -> ".join(self.path_nodes)
            text = f"{head} at op {self.cut.op_name!r} ({self.cut.op_type}) in {self.cut.where()}: {self.cut.reason}"
            if len(self.path_nodes) > 1:
                text += f" Path: {via}."
            return text
        return head + (f" ({self.note})" if self.note else ".")


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + "x".join(str(d) for d in shape) + "]" if shape else ""


@dataclass
class DiagnosisReport:
    """Path diagnostics of one model and target: ``ok`` when every trainable variable gets a gradient."""

    model_name: str
    target: str
    variables: list[VariableDiagnosis]
    n_ops: int = 0
    seconds: float = 0.0
    level1_error: str | None = None  # tape.gradient itself failed (an op with no gradient on a float path)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.connected for v in self.variables) and self.level1_error is None

    @property
    def problems(self) -> list[VariableDiagnosis]:
        return [v for v in self.variables if not v.connected]

    def by_status(self, status: str) -> list[VariableDiagnosis]:
        return [v for v in self.variables if v.status == status]

    def cuts(self) -> list[tuple[Cut, list[VariableDiagnosis]]]:
        """Distinct cut ops with the variables each one blocks (the usual report: one op, many variables)."""
        groups: dict[str, tuple[Cut, list[VariableDiagnosis]]] = {}
        for v in self.variables:
            if v.cut is not None:
                groups.setdefault(v.cut.op_name, (v.cut, []))[1].append(v)
        return list(groups.values())

    def highlight(self) -> dict[str, str]:
        """Node id -> role ("cut", "blocked", "path", "unused", "never_read"), for the graph view."""
        roles: dict[str, str] = {}
        rank = {"cut": 0, "blocked": 1, "unused": 2, "never_read": 3, "path": 4}
        for v in self.problems:
            marks = [(n, "path") for n in v.path_nodes]
            if v.node:
                marks.append((v.node, "blocked" if v.status == "blocked" else v.status))
            if v.cut is not None and v.cut.node:
                marks.append((v.cut.node, "cut"))
            for n, role in marks:
                if n not in roles or rank[role] < rank[roles[n]]:
                    roles[n] = role
        return roles

    def to_text(self) -> str:
        n = len(self.variables)
        counts = ", ".join(f"{len(self.by_status(s))} {s.replace('_', ' ')}" for s in _STATUS_WORDS)
        lines = [f"Gradient paths of {self.model_name!r} to {self.target}: {n} trainable variables ({counts})."]
        if self.level1_error:
            lines.append(f"tape.gradient failed: {self.level1_error}")
        if self.ok:
            lines.append("OK: every trainable variable receives a gradient.")
        for cut, blocked in self.cuts():
            lines.append("")
            lines.append(f"CUT at op {cut.op_name!r} ({cut.op_type}) in {cut.where()}: {cut.reason}")
            names = ", ".join(v.path for v in blocked)
            lines.append(f"  blocks {len(blocked)} variable(s): {names}")
            longest = max(blocked, key=lambda v: len(v.path_nodes))
            if len(longest.path_nodes) > 1:
                lines.append(f"  path: {' -> '.join(longest.path_nodes)}")
            lines.append(f"  fix: {cut.fix}")
        for status in ("unused", "never_read"):
            group = self.by_status(status)
            if group:
                lines.append("")
                lines.append(f"{status.replace('_', ' ').upper()}: {len(group)} variable(s) {_STATUS_WORDS[status]}:")
                lines.extend(f"  {v.message()}" for v in group)
        lost = [v for v in self.by_status("blocked") if v.cut is None]
        for v in lost:
            lines.append(f"  {v.message()}")
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append(f"({self.n_ops} graph ops walked in {self.seconds:.2f} s)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "model_name": self.model_name,
            "target": self.target,
            "ok": self.ok,
            "counts": {s: len(self.by_status(s)) for s in _STATUS_WORDS},
            "variables": [
                {**asdict(v), "shape": list(v.shape), "message": v.message(), "cut": asdict(v.cut) if v.cut else None}
                for v in self.variables
            ],
            "cuts": [
                {
                    **asdict(c),
                    "variables": [v.path for v in vs],
                    "path_nodes": list(max(vs, key=lambda v: len(v.path_nodes)).path_nodes),
                }
                for c, vs in self.cuts()
            ],
            "highlight": self.highlight(),
            "level1_error": self.level1_error,
            "notes": list(self.notes),
            "n_ops": self.n_ops,
            "seconds": self.seconds,
        }


# ------------------------------------------------------------------------------------------------ helpers
def _as_engine(model_or_engine: Any) -> Any:
    from gradscope.engine.runner import Engine

    if isinstance(model_or_engine, Engine):
        return model_or_engine
    if isinstance(model_or_engine, keras.Model):
        return Engine(model_or_engine)
    raise GraphError(f"Expected a keras.Model or an Engine, got {type(model_or_engine).__name__}.")


def _tf_variable(v: Any) -> Any:
    """The tf.Variable behind a Keras variable (the object the tape watches and the graph captures)."""
    value = getattr(v, "value", v)
    if isinstance(value, tf.Variable):
        return value
    return getattr(v, "_value", v)


def _variable_owners(engine: Any) -> dict[int, str]:
    """id(keras variable) -> node id of the first node whose layer owns it (split activations skipped)."""
    owners: dict[int, str] = {}
    for node_id, op in engine.exec.operations.items():
        if node_id.endswith(":act"):
            continue
        for v in getattr(op, "trainable_variables", None) or []:
            owners.setdefault(id(v), node_id)
    return owners


def _input_specs(engine: Any, inputs: Any) -> list[Any]:
    if inputs is not None:
        return [tf.TensorSpec(x.shape, x.dtype) for x in engine._as_inputs(inputs)]
    specs = []
    for node_id in engine.graph.input_ids:
        shape = engine.graph.node(node_id).output_shape
        specs.append(tf.TensorSpec((2, *shape[1:]), tf.float32))  # a fixed batch: custom layers may read it
    return specs


def _dummy_labels(engine: Any, target: Target, batch: int) -> Any:
    out_shape = engine.graph.node(engine.graph.output_ids[0]).output_shape
    if target.loss == "mse":
        return np.zeros((batch, *[d or 1 for d in out_shape[1:]]), np.float32)
    return np.zeros(batch, np.int64)


def _default_scalar(engine: Any, values: dict) -> Any:
    """Sum of every model output, with the logits in place of a final softmax (probabilities sum to 1)."""
    keys = [engine.logits_key, *engine.exec.output_keys[1:]]
    return tf.add_n([tf.reduce_sum(tf.cast(values[k], tf.float32)) for k in keys])


# ------------------------------------------------------------------------------------------------ the trace
@dataclass
class _Trace:
    ops: list[Any]  # forward ops only, in creation order
    index: dict[Any, int]
    marks: list[tuple[int, str | None]]  # (first op index, node id); node None: the target computation
    target: Any  # the scalar tensor
    none_grads: list[bool] | None  # level 1: per trainable variable, gradient is None (None: tape failed)
    watched: set[int]  # id(tf.Variable) read on the tape
    handles: dict[int, Any]  # id(captured external handle) -> internal placeholder
    level1_error: str | None

    def node_of(self, op: Any) -> str | None:
        i = self.index.get(op)
        if i is None:
            return None
        k = bisect_right([m[0] for m in self.marks], i) - 1
        return self.marks[k][1] if k >= 0 else None


def _trace(engine: Any, specs: list[Any], target: Target | None, labels: Any) -> _Trace:
    model_vars = [_tf_variable(v) for v in engine.model.trainable_variables]
    info: dict[str, Any] = {}
    marks: list[tuple[int, str | None]] = []

    def fn(xs: list, labels_t: Any) -> Any:
        graph = tf.compat.v1.get_default_graph()

        def mark(node_id: str | None) -> None:
            marks.append((len(graph.get_operations()), node_id))

        with tf.GradientTape() as tape:
            values, node_values = engine._run(xs, {}, on_step=mark)
            mark(None)
            if target is None:
                scalar = _default_scalar(engine, values)
            else:
                index = -1 if target.index is None else int(target.index)
                class_idx = tf.fill([tf.shape(xs[0])[0]], index)
                scalar, _ = engine._target_scalar(target, values, node_values, class_idx, labels_t)
        info["n_forward"] = len(graph.get_operations())
        info["target"] = scalar
        info["watched"] = {id(v) for v in tape.watched_variables()}
        try:
            grads = tape.gradient(scalar, model_vars, unconnected_gradients=tf.UnconnectedGradients.NONE)
            info["none"] = [g is None for g in grads]
        except LookupError as exc:  # an op on a float path with no registered gradient at all
            info["none"] = None
            info["error"] = str(exc).splitlines()[0]
        return scalar

    labels_spec = tf.TensorSpec(labels.shape, labels.dtype)
    concrete = tf.function(fn).get_concrete_function(specs, labels_spec)
    graph = concrete.graph
    ops = graph.get_operations()[: info["n_forward"]]
    handles = {id(external): internal for external, internal in graph.captures}
    return _Trace(
        ops=ops,
        index={op: i for i, op in enumerate(ops)},
        marks=marks,
        target=info["target"],
        none_grads=info.get("none"),
        watched=info["watched"],
        handles=handles,
        level1_error=info.get("error"),
    )


# ------------------------------------------------------------------------------------------------ level 2
class _GraphWalk:
    """Data-flow facts about the forward graph: resources, reads, writes, what reaches the target."""

    def __init__(self, trace: _Trace) -> None:
        self.trace = trace
        self.forward = set(trace.ops)
        self.reads: dict[Any, list[Any]] = {}  # resource root tensor -> read ops
        self.writes: dict[Any, list[Any]] = {}  # resource root tensor -> write ops
        for op in trace.ops:
            for t in op.inputs:
                if t.dtype != tf.resource:
                    continue
                root = self.root(t).ref()
                if _is_state_write(op.type):
                    self.writes.setdefault(root, []).append(op)
                elif op.type not in _NOT_READS and not all(o.dtype == tf.resource for o in op.outputs):
                    self.reads.setdefault(root, []).append(op)
        self.reaches = self._reaches_target()

    def root(self, t: Any) -> Any:
        """The placeholder a resource tensor comes from (through Identity-like ops)."""
        seen = 0
        while t.op.inputs and t.op.type != "Placeholder" and t.op.inputs[0].dtype == tf.resource and seen < 64:
            t = t.op.inputs[0]
            seen += 1
        return t

    def consumers(self, t: Any) -> list[Any]:
        return [c for c in t.consumers() if c in self.forward]

    def _reaches_target(self) -> set[Any]:
        """Tensors and ops from which the target is reachable (data edges plus write -> read of a resource)."""
        seen: set[Any] = set()  # tensor refs and ops
        queue = deque([self.trace.target])
        while queue:
            t = queue.popleft()
            if t.ref() in seen:
                continue
            seen.add(t.ref())
            op = t.op
            if op not in self.forward:
                continue
            seen.add(op)
            for x in op.inputs:
                queue.append(x)
                if x.dtype == tf.resource:  # a read: whatever was written into the resource reaches it too
                    for w in self.writes.get(self.root(x).ref(), []):
                        if w not in seen:
                            seen.add(w)
                            queue.extend(i for i in w.inputs if i.dtype != tf.resource)
        return seen

    def analyse(self, placeholder: Any) -> tuple[bool, list[tuple[Any, str]], dict[Any, tuple[Any, Any]], bool]:
        """From one variable's resource: (target reached differentiably, cut ops with kinds, parents, read at all).

        ``parents`` maps a reached tensor's ref to (op, parent tensor) for the path back to the read, and
        ``("cut", op)`` to (op, the reached tensor it consumes).
        """
        reads = self.reads.get(self.root(placeholder).ref(), [])
        parents: dict[Any, tuple[Any, Any]] = {}
        queue: deque[Any] = deque()

        def reach(op: Any, parent: Any) -> None:
            for o in op.outputs:
                if _differentiable_dtype(o.dtype) and o.ref() not in parents:
                    parents[o.ref()] = (op, parent)
                    queue.append(o)

        for op in reads:
            if _passes_gradient(op):
                reach(op, None)
        reached: list[Any] = []
        while queue:
            t = queue.popleft()
            reached.append(t)
            for c in self.consumers(t):
                if _passes_gradient(c):
                    reach(c, t)
        if self.trace.target.ref() in parents:
            return True, [], parents, bool(reads)
        cuts: list[tuple[Any, str]] = []
        for t in reached:
            if t.ref() not in self.reaches:
                continue
            for c in self.consumers(t):
                if ("cut", c) in parents:
                    continue
                if _is_state_write(c.type):
                    hit = c in self.reaches
                else:
                    hit = any(o.ref() in self.reaches and o.ref() not in parents for o in c.outputs)
                if hit:
                    parents[("cut", c)] = (c, t)
                    cuts.append((c, _cut_kind(c)))
        return False, cuts, parents, bool(reads)


def _path_to(parents: dict[Any, tuple[Any, Any]], cut_op: Any) -> list[Any]:
    """Ops from the variable's read to ``cut_op`` (inclusive), following the BFS parents."""
    op, t = parents[("cut", cut_op)]
    path = [op]
    steps = 0
    while t is not None and steps < 100_000:
        producer, t = parents[t.ref()]
        path.append(producer)
        steps += 1
    return list(reversed(path))


def _cut_reason(op: Any, kind: str, written: str | None) -> str:
    if kind == "state_write":
        target = f"variable {written!r}" if written else "a variable"
        return (
            f"the value is written into {target} with assign(); the later read of that variable starts a new "
            "path, so no gradient flows back to what was written."
        )
    if kind == "stop_gradient":
        return "stop_gradient blocks the gradient on purpose."
    if kind == "no_gradient":
        return f"TensorFlow op {op.type} has no gradient."
    if kind == "comparison":
        return f"{op.type} turns the value into a boolean, which has no gradient."
    if kind == "shape":
        return f"only the shape of the value is used ({op.type})."
    dtypes = ", ".join(sorted({o.dtype.name for o in op.outputs}))
    if op.type in _NONE_GRAD_FLOAT_OPS:
        return f"{op.type} rounds the value; its gradient is None (zero almost everywhere)."
    return f"{op.type} turns the value into {dtypes}; integer values carry no gradient."


def diagnose_model(
    model: Any,
    inputs: Any = None,
    target: Target | None = None,
    *,
    labels: Any = None,
) -> DiagnosisReport:
    """Which trainable variables get a gradient of ``target``, and for those that don't, where it is cut.

    ``model``: a keras.Model or an ``Engine``. ``inputs``: sample inputs (only their shapes matter: the forward
    pass is traced, not run, so nothing in the model changes, not even a variable an ``assign`` would write);
    None uses the model's input shapes with a batch of 2. ``target``: None is the sum of all outputs (logits
    in place of a final softmax); a loss target uses ``labels`` (dummy labels when None).
    """
    start = time.perf_counter()
    engine = _as_engine(model)
    specs = _input_specs(engine, inputs)
    batch = int(specs[0].shape[0] or 2)
    if target is not None and target.kind == "loss":
        target = loss_targets.resolve(engine, target)
        labels_t = loss_targets.prepare_labels(
            engine, target, labels if labels is not None else _dummy_labels(engine, target, batch), batch
        )
    else:
        labels_t = tf.zeros([0], tf.float32)
    trace = _trace(engine, specs, target, labels_t)
    walk = _GraphWalk(trace)
    owners = _variable_owners(engine)
    by_handle = {id(_tf_variable(v).handle): v for v in engine.model.variables}
    placeholder_var = {}
    for handle_id, placeholder in trace.handles.items():
        if handle_id in by_handle:
            placeholder_var[walk.root(placeholder).ref()] = by_handle[handle_id]
    nodes = {n.id: n for n in engine.graph.nodes}

    def layer_of(node_id: str | None) -> str | None:
        return nodes[node_id].layer_name if node_id in nodes else None

    results = []
    for i, v in enumerate(engine.model.trainable_variables):
        tv = _tf_variable(v)
        owner = owners.get(id(v))
        placeholder = trace.handles.get(id(tv.handle))
        shape = tuple(int(d) for d in v.shape)
        base = dict(path=v.path, shape=shape, node=owner, layer=layer_of(owner))
        level1_none = None if trace.none_grads is None else trace.none_grads[i]
        if id(tv) not in trace.watched and placeholder is None:
            results.append(VariableDiagnosis(**base, status="never_read"))
            continue
        if placeholder is None:  # watched, yet not captured by this graph: nothing to walk
            status = "connected" if level1_none is False else "blocked"
            results.append(VariableDiagnosis(**base, status=status, note="not found in the traced graph"))
            continue
        reached, cuts, parents, read = walk.analyse(placeholder)
        first_read = walk.reads.get(walk.root(placeholder).ref(), [])
        if first_read and owner is None:
            owner = trace.node_of(first_read[0])
            base.update(node=owner, layer=layer_of(owner))
        if level1_none is False or (level1_none is None and reached):
            note = "" if reached else "level 2 found no differentiable path (please report)"
            results.append(VariableDiagnosis(**base, status="connected", note=note))
            continue
        if not read:
            results.append(VariableDiagnosis(**base, status="never_read"))
            continue
        if not cuts:
            note = "level 2 found a differentiable path; the tape still gives None" if reached else ""
            status = "blocked" if reached else "unused"
            results.append(VariableDiagnosis(**base, status=status, note=note))
            continue
        # Most telling kind first; among integer cuts the op the user wrote (ArgMax, Cast) before internals.
        cuts.sort(key=lambda ck: (CUT_KINDS.index(ck[1]), ck[0].type not in _NAMED_INTEGER_OPS, trace.index[ck[0]]))
        cut_op, kind = cuts[0]
        written = None
        if kind == "state_write":
            res = [t for t in cut_op.inputs if t.dtype == tf.resource]
            wv = placeholder_var.get(walk.root(res[0]).ref()) if res else None
            written = wv.path if wv is not None else None
        cut_node = trace.node_of(cut_op)
        cut = Cut(
            op_name=cut_op.name,
            op_type=cut_op.type,
            kind=kind,
            node=cut_node,
            layer=layer_of(cut_node),
            reason=_cut_reason(cut_op, kind, written),
            fix=_FIXES[kind],
            writes_variable=written,
        )
        path_ops = _path_to(parents, cut_op)
        path_nodes: list[str] = []
        for op in path_ops:
            n = trace.node_of(op) or "(target)"
            if not path_nodes or path_nodes[-1] != n:
                path_nodes.append(n)
        others = tuple(dict.fromkeys(f"{c.name} ({k})" for c, k in cuts[1:] if k not in ("shape",)))
        results.append(
            VariableDiagnosis(
                **base,
                status="blocked",
                cut=cut,
                path_nodes=tuple(path_nodes),
                path_ops=tuple(op.name for op in path_ops),
                other_cuts=others,
            )
        )
    target_text = "the sum of the outputs (logits)" if target is None else target.describe()
    report = DiagnosisReport(
        model_name=engine.model.name,
        target=target_text,
        variables=results,
        n_ops=len(trace.ops),
        seconds=time.perf_counter() - start,
        level1_error=trace.level1_error,
    )
    if not engine.model.trainable_variables:
        report.notes.append("the model has no trainable variables")
    trainable = {id(v) for v in engine.model.trainable_variables}
    for root, writes in walk.writes.items():
        v = placeholder_var.get(root)
        if v is not None and id(v) in trainable:
            where = trace.node_of(writes[0])
            report.notes.append(
                f"trainable variable {v.path!r} is overwritten in the forward pass ({writes[0].type} in node "
                f"{where!r}): what the optimizer learns for it is replaced at the next step."
            )
    return report


# ================================================================================================ gradient flow
@dataclass(frozen=True)
class FlowThresholds:
    """When a layer is flagged in the gradient-flow report (defaults and why).

    - ``vanishing_ratio = 1e-7``: ``|grad W| / |W|`` below this means even a learning rate of 1 moves the
      weights by less than float32 resolution (eps = 1.2e-7): the layer is frozen in practice.
    - ``exploding_ratio = 10``: one SGD step at lr 0.1 would move the weights by more than their own norm.
    - ``vanishing_activation = 1e-6`` / ``exploding_activation = 1e6``: mean ``|g|`` at a node relative to the
      output end of the backward pass (the node nearest the target with a non-zero gradient). Signals that
      shrink or grow by six orders of magnitude on the way down are the classic vanishing / exploding picture;
      the ratio is independent of the loss scale.
    - ``dead_relu = 0.5``: flag a ReLU node when at least half of its units (channels; neurons of a Dense)
      output 0 for every sample of the batch (and every position): those units pass no gradient at all.
    """

    vanishing_ratio: float = 1e-7
    exploding_ratio: float = 10.0
    vanishing_activation: float = 1e-6
    exploding_activation: float = 1e6
    dead_relu: float = 0.5

    def describe(self) -> str:
        return (
            f"vanishing if |grad W|/|W| < {self.vanishing_ratio:g} or mean|g| < {self.vanishing_activation:g} x the "
            f"output end; exploding if |grad W|/|W| > {self.exploding_ratio:g} or mean|g| > "
            f"{self.exploding_activation:g} x the output end; dead ReLU if >= {self.dead_relu:.0%} of units are 0 "
            "for the whole batch"
        )


#: ReLU-like activations whose "dead" units output exactly 0.
_RELU_ACTIVATIONS = ("relu", "relu6")


@dataclass(frozen=True)
class WeightFlow:
    """Gradient of one trainable variable."""

    path: str
    node: str | None
    shape: tuple[int, ...]
    norm: float  # |W|
    grad_norm: float  # |grad W|
    grad_mean_abs: float
    grad_max_abs: float
    ratio: float  # |grad W| / |W| (nan when |W| = 0, e.g. a zero-initialised bias)
    nan_count: int
    inf_count: int
    is_none: bool  # no gradient at all (disconnected / cut)


@dataclass(frozen=True)
class FlowRow:
    """One node: the gradient arriving at its output, and the gradient of its layer's weights."""

    node: str
    layer: str | None
    op_type: str
    status: str  # none | nan | zero | ok (of the activation gradient)
    grad_norm: float
    grad_mean_abs: float
    grad_max_abs: float
    grad_zero_fraction: float
    grad_relative: float  # mean|g| / mean|g| at the output end
    grad_nan: int
    grad_inf: int
    weight_paths: tuple[str, ...] = ()
    weight_norm: float = math.nan
    weight_grad_norm: float = math.nan
    weight_grad_mean_abs: float = math.nan
    weight_grad_max_abs: float = math.nan
    weight_ratio: float = math.nan
    weight_nan: int = 0
    weight_inf: int = 0
    weights_without_gradient: tuple[str, ...] = ()
    dead_relu_fraction: float | None = None
    flags: tuple[str, ...] = ()


FLOW_COLUMNS = (
    "node",
    "layer",
    "op_type",
    "status",
    "grad_norm",
    "grad_mean_abs",
    "grad_max_abs",
    "grad_zero_fraction",
    "grad_relative",
    "grad_nan",
    "grad_inf",
    "weight_norm",
    "weight_grad_norm",
    "weight_grad_mean_abs",
    "weight_grad_max_abs",
    "weight_ratio",
    "weight_nan",
    "weight_inf",
    "dead_relu_fraction",
    "flags",
)


@dataclass
class FlowReport:
    """Per-layer gradient flow of one backward pass; ``rows`` in graph order (inputs excluded)."""

    model_name: str
    target: str
    rows: list[FlowRow]
    weights: list[WeightFlow]
    thresholds: FlowThresholds
    reference_node: str | None  # the output-end node relative values are measured against
    loss_value: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def row(self, node_id: str) -> FlowRow:
        for r in self.rows:
            if r.node == node_id:
                return r
        raise GraphError(f"No node {node_id!r} in the gradient-flow report.")

    def flagged(self, flag: str | None = None) -> list[FlowRow]:
        return [r for r in self.rows if (flag in r.flags if flag else r.flags)]

    @property
    def ok(self) -> bool:
        return not self.flagged()

    def table(self) -> list[dict[str, Any]]:
        out = []
        for r in self.rows:
            d = {c: getattr(r, c) for c in FLOW_COLUMNS}
            d["flags"] = " ".join(r.flags)
            out.append(d)
        return out

    def to_csv(self, path: str | Path) -> Path:
        """One row per node (columns ``FLOW_COLUMNS``); empty cells where a value does not apply."""
        path = Path(path)
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FLOW_COLUMNS)
            writer.writeheader()
            for d in self.table():
                writer.writerow({k: _csv_cell(v) for k, v in d.items()})
        return path

    def weights_to_csv(self, path: str | Path) -> Path:
        path = Path(path)
        names = [f.name for f in WeightFlow.__dataclass_fields__.values()]
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=names)
            writer.writeheader()
            for w in self.weights:
                d = asdict(w)
                d["shape"] = "x".join(str(s) for s in w.shape)
                writer.writerow({k: _csv_cell(v) for k, v in d.items()})
        return path

    def to_text(self) -> str:
        head = f"Gradient flow of {self.model_name!r}, target {self.target}"
        if self.loss_value is not None:
            head += f" (loss {self.loss_value:.6g})"
        lines = [head + ":"]
        cols = ("node", "mean|g|", "max|g|", "rel", "|gW|/|W|", "dead", "flags")
        table = [cols]
        for r in self.rows:
            table.append(
                (
                    r.node,
                    _num(r.grad_mean_abs) if r.status != "none" else "none",
                    _num(r.grad_max_abs) if r.status != "none" else "",
                    _num(r.grad_relative),
                    _num(r.weight_ratio) if r.weight_paths else "",
                    f"{r.dead_relu_fraction:.0%}" if r.dead_relu_fraction is not None else "",
                    " ".join(r.flags),
                )
            )
        widths = [max(len(str(row[i])) for row in table) for i in range(len(cols))]
        for row in table:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        flagged = self.flagged()
        lines.append(f"{len(flagged)} flagged node(s); thresholds: {self.thresholds.describe()}.")
        if self.reference_node:
            lines.append(f"rel = mean|g| relative to {self.reference_node!r} (the output end).")
        return "\n".join(lines)

    def to_png(self, path: str | Path) -> Path:
        """A headless chart (Pillow): per node, mean|g| and max|g| on a log scale, and |grad W| / |W| with the
        vanishing / exploding thresholds; flagged nodes in red, nodes without a gradient marked "none"."""
        return _flow_png(self, Path(path))

    def to_dict(self) -> dict:
        return {
            "model_name": self.model_name,
            "target": self.target,
            "loss_value": self.loss_value,
            "reference_node": self.reference_node,
            "thresholds": asdict(self.thresholds),
            "rows": [{**asdict(r), "flags": list(r.flags)} for r in self.rows],
            "weights": [{**asdict(w), "shape": list(w.shape)} for w in self.weights],
            "meta": {k: v for k, v in self.meta.items() if isinstance(v, (str, int, float, bool, list)) or v is None},
        }


def _log_span(values: list[float], floor: float = 1e-30) -> tuple[float, float]:
    logs = [math.log10(max(v, floor)) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not logs:
        return -1.0, 1.0
    lo, hi = math.floor(min(logs)), math.ceil(max(logs))
    return (lo - 1.0, hi + 1.0) if lo == hi else (float(lo), float(hi))


def _flow_png(report: FlowReport, path: Path) -> Path:
    from PIL import Image, ImageDraw

    row_h, top, label_w, panel_w, flag_w = 16, 44, 8 + 7 * max((len(r.node) for r in report.rows), default=4), 300, 190
    width = label_w + 2 * (panel_w + 20) + flag_w
    height = top + row_h * len(report.rows) + 24
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    grads = [r.grad_mean_abs for r in report.rows] + [r.grad_max_abs for r in report.rows]
    t = report.thresholds
    ratios = [r.weight_ratio for r in report.rows] + [t.vanishing_ratio, t.exploding_ratio]
    panels = [
        (label_w, _log_span(grads), "mean|g| (bar), max|g| (tick)"),
        (label_w + panel_w + 20, _log_span(ratios), "|grad W| / |W|"),
    ]

    def x_of(panel: tuple, v: float) -> float:
        x0, (lo, hi), _ = panel
        return x0 + panel_w * (min(max(math.log10(max(v, 1e-30)), lo), hi) - lo) / (hi - lo)

    draw.text((6, 4), f"{report.model_name}: {report.target}"[:160], fill="black")
    for panel in panels:
        x0, (lo, hi), title = panel
        draw.text((x0, 18), f"{title}, log10 {lo:g}..{hi:g}", fill="black")
        for k in range(int(lo), int(hi) + 1):
            x = x_of(panel, 10.0**k)
            draw.line([(x, top - 4), (x, height - 20)], fill=(225, 225, 225))
        draw.text((x0, height - 16), f"1e{int(lo)}", fill="gray")
        draw.text((x0 + panel_w - 30, height - 16), f"1e{int(hi)}", fill="gray")
    for limit in (t.vanishing_ratio, t.exploding_ratio):
        if limit > 0:
            x = x_of(panels[1], limit)
            draw.line([(x, top - 4), (x, height - 20)], fill=(240, 160, 160))
    for i, r in enumerate(report.rows):
        y = top + i * row_h
        color = (200, 30, 30) if r.flags else (40, 40, 40)
        draw.text((4, y + 2), r.node, fill=color)
        bar = (220, 80, 80) if r.flags else (70, 120, 200)
        if r.status == "none":
            draw.text((panels[0][0] + 2, y + 2), "none", fill="gray")
        elif r.grad_mean_abs > 0 and math.isfinite(r.grad_mean_abs):
            draw.rectangle([panels[0][0], y + 3, x_of(panels[0], r.grad_mean_abs), y + row_h - 3], fill=bar)
            if r.grad_max_abs > 0 and math.isfinite(r.grad_max_abs):
                xm = x_of(panels[0], r.grad_max_abs)
                draw.line([(xm, y + 1), (xm, y + row_h - 1)], fill=(20, 20, 20), width=2)
        if r.weight_paths and math.isfinite(r.weight_ratio) and r.weight_ratio > 0:
            draw.rectangle([panels[1][0], y + 3, x_of(panels[1], r.weight_ratio), y + row_h - 3], fill=bar)
        elif r.weights_without_gradient:
            draw.text((panels[1][0] + 2, y + 2), "none", fill="gray")
        if r.flags:
            draw.text((label_w + 2 * (panel_w + 20), y + 2), " ".join(r.flags), fill=color)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def _csv_cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (tuple, list)):
        return " ".join(str(x) for x in v)
    return v


def _num(v: float) -> str:
    return "" if v is None or math.isnan(v) else f"{v:.3g}"


def dead_unit_fraction(values: np.ndarray) -> float:
    """Fraction of units (last axis) that are 0 for every sample and position: the dead-ReLU fraction."""
    v = np.asarray(values)
    if v.ndim < 2 or v.shape[-1] == 0:
        return math.nan
    per_unit = np.all(v.reshape(-1, v.shape[-1]) == 0, axis=0)
    return float(per_unit.mean())


def _weight_flow(path: str, node: str | None, value: np.ndarray, grad: np.ndarray | None) -> WeightFlow:
    w = np.asarray(value, np.float64)
    norm = float(np.linalg.norm(w))
    if grad is None:
        return WeightFlow(path, node, tuple(w.shape), norm, math.nan, math.nan, math.nan, math.nan, 0, 0, True)
    g = np.asarray(grad, np.float64)
    finite = np.isfinite(g)
    gn = float(np.linalg.norm(g))
    a = np.abs(g)
    return WeightFlow(
        path=path,
        node=node,
        shape=tuple(w.shape),
        norm=norm,
        grad_norm=gn,
        grad_mean_abs=float(a.mean()) if a.size else 0.0,
        grad_max_abs=float(a.max()) if a.size else 0.0,
        ratio=gn / norm if norm > 0 else math.nan,
        nan_count=int(np.isnan(g).sum()),
        inf_count=int((~finite).sum() - np.isnan(g).sum()),
        is_none=False,
    )


def _ancestors(graph: Any, node_id: str) -> set[str]:
    seen = {node_id}
    stack = [node_id]
    while stack:
        for parent in graph.node(stack.pop()).inputs:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


_NO_GRADIENT_TEXT = re.compile(r"gradient registry has no entry|No gradient defined for operation")


def gradient_flow(
    engine_or_model: Any,
    inputs: Any,
    labels: Any = None,
    loss: str | None = None,
    weight_grads: bool = True,
    *,
    target: Target | None = None,
    plan: Any = None,
    thresholds: FlowThresholds | None = None,
) -> FlowReport:
    """Per-layer gradient flow of one backward pass.

    With ``labels`` the target is the training loss (``loss``: "auto" (default), "compiled", "crossentropy",
    "mse"; see ``gradscope.engine.loss_targets``); without, ``target`` (default: the top-1 logit).
    ``weight_grads``: also the weights' gradients and ``|grad W| / |W|`` (opt-in in the engine: ~1.7x cost).
    ``plan``: rules to apply (compare a modified backward pass with the baseline ``plan=None``).
    """
    engine = _as_engine(engine_or_model)
    thresholds = thresholds or FlowThresholds()
    if labels is not None:
        target = Target(kind="loss", loss=loss)
    elif loss is not None:
        from gradscope.core.errors import TargetError

        raise TargetError(f"Loss {loss!r} needs labels: pass labels (one class index per sample, or targets).")
    target = target or Target()
    graph = engine.graph
    relu_nodes = [n.id for n in graph.nodes if n.activation in _RELU_ACTIVATIONS and not n.is_input]
    try:
        result = engine.backward(inputs, target, plan, capture=relu_nodes, weight_grads=weight_grads, labels=labels)
    except Exception as exc:  # an op on a float path has no gradient at all: the tape cannot backprop
        missing = [line.strip() for line in str(exc).splitlines() if _NO_GRADIENT_TEXT.search(line)]
        if not missing:
            raise
        raise GraphError(
            f"The backward pass fails: {missing[0].removeprefix('LookupError: ')}. Run `gradscope diagnose MODEL` "
            "to find the op."
        ) from exc

    weights: list[WeightFlow] = []
    by_node: dict[str, list[WeightFlow]] = {}
    if weight_grads:
        owners = _variable_owners(engine)
        grads = result.meta.get("weight_grads", {})
        none = set(result.meta.get("none_weights", []))
        for v in engine.model.trainable_variables:
            node = owners.get(id(v))
            g = None if v.path in none else grads.get(v.path)
            wf = _weight_flow(v.path, node, np.asarray(v.numpy()), g)
            weights.append(wf)
            if node is not None:
                by_node.setdefault(node, []).append(wf)

    # The output end: nodes nearest the target first; a node downstream of the target gets no gradient by design.
    target_node = target.node if target.kind in ("neuron", "channel") and target.node else None
    if target_node is None:
        target_node = graph.output_ids[0]
        if engine.softmax_stripped and target.kind in ("class", "loss"):
            target_node = graph.node(target_node).inputs[0]
    upstream = _ancestors(graph, target_node)
    reference_node, reference = None, math.nan
    for n in reversed(graph.nodes):
        s = result.stats.get(n.id)
        if s is not None and n.id in upstream and not s.is_none and s.mean_abs > 0 and math.isfinite(s.mean_abs):
            reference_node, reference = n.id, s.mean_abs
            break

    rows = []
    for n in graph.nodes:
        if n.is_input or n.id not in result.stats:
            continue
        s = result.stats[n.id]
        rel = s.mean_abs / reference if not s.is_none and reference > 0 else math.nan
        flags: list[str] = []
        if s.is_none and n.id in upstream:
            flags.append("no_gradient")
        if s.nan_count or s.inf_count:
            flags.append("nan")
        if not s.is_none and s.max_abs == 0 and n.id in upstream:
            flags.append("zero_gradient")
        elif not math.isnan(rel) and rel < thresholds.vanishing_activation:
            flags.append("vanishing")
        if not math.isnan(rel) and rel > thresholds.exploding_activation:
            flags.append("exploding")
        dead = None
        if n.id in result.node_values:
            dead = dead_unit_fraction(result.node_values[n.id])
            if not math.isnan(dead) and dead >= thresholds.dead_relu:
                flags.append("dead_relu")
        extra: dict[str, Any] = {}
        ws = by_node.get(n.id, [])
        if ws:
            have = [w for w in ws if not w.is_none]
            norm = math.sqrt(sum(w.norm**2 for w in ws))
            gnorm = math.sqrt(sum(w.grad_norm**2 for w in have)) if have else math.nan
            size = sum(math.prod(w.shape) for w in have)
            mean_abs = sum(w.grad_mean_abs * math.prod(w.shape) for w in have) / size if size else math.nan
            ratio = gnorm / norm if have and norm > 0 else math.nan
            extra = dict(
                weight_paths=tuple(w.path for w in ws),
                weight_norm=norm,
                weight_grad_norm=gnorm,
                weight_grad_mean_abs=mean_abs,
                weight_grad_max_abs=max((w.grad_max_abs for w in have), default=math.nan),
                weight_ratio=ratio,
                weight_nan=sum(w.nan_count for w in have),
                weight_inf=sum(w.inf_count for w in have),
                weights_without_gradient=tuple(w.path for w in ws if w.is_none),
            )
            if extra["weights_without_gradient"]:
                flags.append("weights_no_gradient")
            if (extra["weight_nan"] or extra["weight_inf"]) and "nan" not in flags:
                flags.append("nan")
            if have and gnorm == 0:
                flags.append("weights_zero_gradient")
            elif not math.isnan(ratio) and ratio < thresholds.vanishing_ratio and "vanishing" not in flags:
                flags.append("vanishing")
            if not math.isnan(ratio) and ratio > thresholds.exploding_ratio and "exploding" not in flags:
                flags.append("exploding")
        rows.append(
            FlowRow(
                node=n.id,
                layer=n.layer_name,
                op_type=n.op_type,
                status=s.status,
                grad_norm=s.norm,
                grad_mean_abs=s.mean_abs,
                grad_max_abs=s.max_abs,
                grad_zero_fraction=s.zero_fraction,
                grad_relative=rel,
                grad_nan=s.nan_count,
                grad_inf=s.inf_count,
                dead_relu_fraction=dead,
                flags=tuple(flags),
                **extra,
            )
        )
    return FlowReport(
        model_name=engine.model.name,
        target=result.meta.get("loss") or target.describe(),
        rows=rows,
        weights=weights,
        thresholds=thresholds,
        reference_node=reference_node,
        loss_value=result.meta.get("loss_value"),
        meta={"seconds": result.meta.get("seconds"), "softmax_stripped": engine.softmax_stripped},
    )


# ================================================================================================ CLI commands
# `gradscope flow` and `gradscope diagnose` (wired in gradscope/cli.py through its _delegate helper).
def _cli_inputs(args: Any, engine: Any) -> list[np.ndarray] | None:
    """Model inputs from ``--input`` files: .npy (one array), .npz (one array per model input), or images."""
    from gradscope.core.errors import ImageLoadError

    files = list(getattr(args, "input", None) or [])
    if not files:
        return None
    input_ids = engine.graph.input_ids
    arrays: list[np.ndarray] = []
    for f in files:
        p = Path(f).expanduser()
        if not p.is_file():
            raise ImageLoadError(f"Input file not found: {p}")
        if p.suffix.lower() in (".npy", ".npz"):
            try:
                loaded = np.load(p, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise ImageLoadError(f"Cannot read {p.name} as a NumPy array: {exc}") from None
            if isinstance(loaded, np.ndarray):
                arrays.append(loaded)
            else:
                with loaded:
                    arrays.extend(loaded[k] for k in loaded.files)
        else:
            from gradscope.io.images import load_image, prepare_input

            which = input_ids[min(len(arrays), len(input_ids) - 1)]
            shape = engine.graph.node(which).output_shape
            arrays.append(prepare_input(load_image(p), shape, getattr(args, "preprocessing", "unit")))
    if len(input_ids) == 1 and len(arrays) > 1:  # several files for one input: one batch
        arrays = [
            np.concatenate(
                [a if a.ndim == len(engine.graph.node(input_ids[0]).output_shape) else a[None] for a in arrays]
            )
        ]
    if len(arrays) != len(input_ids):
        raise ImageLoadError(
            f"The model takes {len(input_ids)} inputs ({', '.join(input_ids)}); got {len(arrays)} array(s). "
            "Give one --input per model input, or one .npz file holding them in order."
        )
    return [np.asarray(a, np.float32) for a in arrays]


def _random_inputs(engine: Any, batch: int = 8) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for node_id in engine.graph.input_ids:
        shape = [d if d is not None else 32 for d in engine.graph.node(node_id).output_shape[1:]]
        out.append(rng.normal(size=(batch, *shape)).astype(np.float32))
    return out


def _cli_labels(text: str | None) -> np.ndarray | None:
    from gradscope.core.errors import TargetError

    if text is None:
        return None
    p = Path(text).expanduser()
    if p.suffix.lower() == ".npy":
        if not p.is_file():
            raise TargetError(f"Labels file not found: {p}")
        return np.load(p, allow_pickle=False)
    parts = [s.strip() for s in text.split(",") if s.strip()]
    try:
        values = [float(s) for s in parts]
    except ValueError:
        raise TargetError(f"Cannot read labels {text!r}: give class indices like 3 or 0,2,1, or a .npy file.") from None
    if all(v == int(v) for v in values):
        return np.array([int(v) for v in values], np.int64)
    return np.array(values, np.float32)


def _info(args: Any, message: str) -> None:
    import sys

    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)


def cmd_flow(args: Any) -> int:
    """``gradscope flow MODEL [--input F ...] [--label L] [--loss NAME] [--csv F] [--png F] [--json]``."""
    import json

    from gradscope.cli import _engine
    from gradscope.rules.plan import Plan

    engine = _engine(args)
    xs = _cli_inputs(args, engine)
    if xs is None:
        xs = _random_inputs(engine)
        _info(args, f"no --input: using {len(xs[0])} seeded random samples")
    labels = _cli_labels(getattr(args, "label", None))
    if labels is not None and labels.ndim == 1 and labels.size == 1 and len(xs[0]) > 1:
        labels = np.repeat(labels, len(xs[0]))
    target = Target.parse(args.target) if getattr(args, "target", None) else None
    plan = Plan.load(args.plan) if getattr(args, "plan", None) else None
    report = gradient_flow(
        engine,
        xs if len(xs) > 1 else xs[0],
        labels=labels,
        loss=getattr(args, "loss", None),
        weight_grads=not getattr(args, "no_weights", False),
        target=target,
        plan=plan,
    )
    print(json.dumps(report.to_dict(), indent=2, default=str) if getattr(args, "json", False) else report.to_text())
    if getattr(args, "csv", None):
        _info(args, f"wrote {report.to_csv(args.csv)}")
    if getattr(args, "png", None):
        _info(args, f"wrote {report.to_png(args.png)}")
    return 0


def cmd_diagnose(args: Any) -> int:
    """``gradscope diagnose MODEL [--input F ...] [--target T | --label L [--loss NAME]] [--json]``.

    Exit code 0 when every trainable variable gets a gradient, 1 when some do not.
    """
    import json

    from gradscope.cli import _engine

    engine = _engine(args)
    xs = _cli_inputs(args, engine)
    labels = _cli_labels(getattr(args, "label", None))
    target = Target.parse(args.target) if getattr(args, "target", None) else None
    if labels is not None or getattr(args, "loss", None):
        target = Target(kind="loss", loss=getattr(args, "loss", None))
    if labels is not None and labels.ndim == 1 and labels.size == 1:
        labels = np.repeat(labels, len(xs[0]) if xs else 2)
    report = diagnose_model(engine, None if xs is None else (xs if len(xs) > 1 else xs[0]), target, labels=labels)
    print(json.dumps(report.to_dict(), indent=2, default=str) if getattr(args, "json", False) else report.to_text())
    return 0 if report.ok else 1
