"""Path diagnostics: where gradients stop and which op cuts the path.

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
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gradscope.backend import gradient_function, keras, tf
from gradscope.core.errors import GraphError
from gradscope.core.targets import Target
from gradscope.engine.backward import loss_targets

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
    return gradient_function(op) is not None


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
def as_engine(model_or_engine: Any) -> Any:
    from gradscope.engine.backward.runner import Engine

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


def variable_owners(engine: Any) -> dict[int, str]:
    """id(keras variable) -> node id of the first node whose layer owns it (split activations skipped)."""
    owners: dict[int, str] = {}
    for node_id, op in engine.exec.operations.items():
        if engine.graph.node(node_id).fused_with is not None:  # the layer's weights belong to "<id>:pre"
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
    engine = as_engine(model)
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
    owners = variable_owners(engine)
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
