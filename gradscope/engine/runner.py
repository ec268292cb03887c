"""Run a model node by node inside ``tf.function``, wrap planned nodes in their rules, backprop once.

Measured design (see DESIGN.md): the node loop costs nothing inside ``tf.function``; every node's gradient is
captured in ONE ``tape.gradient`` call; statistics are computed in-graph and only the tensors the caller asks
for come back to the host; traced functions are cached per (plan, target kind, captures) so re-running a
plan that was seen before does not retrace.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from gradscope.core.errors import GradscopeError, RuleError, TargetError
from gradscope.core.graph import LayerGraph
from gradscope.core.results import BackwardResult, NodeStats
from gradscope.core.targets import Target
from gradscope.engine import loss_targets
from gradscope.engine.context import RuleContext
from gradscope.engine.keras_graph import ExecGraph, Step, build_exec_graph, linear_activation
from gradscope.engine.tf import keras, tf
from gradscope.rules.plan import Plan, Resolution

_CACHE_SIZE = 24


def _is_float_tensor(x: Any) -> bool:
    return tf.is_tensor(x) and x.dtype.is_floating


def _weight_name(v: Any) -> str:
    return (getattr(v, "path", None) or v.name).split("/")[-1].split(":")[0]


class Engine:
    """Backward passes of one Keras model under plans of rules. Never modifies the model.

    >>> engine = Engine(model)
    >>> result = engine.backward(x, Target(index=3), Plan().with_entry("type:ReLU", "guided_backprop"))
    >>> result.input_grad.shape
    """

    def __init__(self, model: Any, *, strip_softmax: bool = True) -> None:
        self.model = model
        self.exec: ExecGraph = build_exec_graph(model)
        self.graph: LayerGraph = self.exec.graph
        self.strip_softmax = strip_softmax
        self._cache: OrderedDict[tuple, tuple[Any, dict]] = OrderedDict()
        self._lock = threading.RLock()
        self._step_of = {s.node_id: s for s in self.exec.steps if s.node_id}
        self.stat_nodes = [n.id for n in self.graph.nodes if not n.is_input]
        self.logits_key = self._find_logits_key()
        self.trace_count = 0

    # ------------------------------------------------------------------------------------------- structure
    def _find_logits_key(self) -> Any:
        out_key = self.exec.output_keys[0]
        if not self.strip_softmax:
            return out_key
        producer = self.graph.node(self.graph.output_ids[0])
        if producer.activation == "softmax":
            step = self._step_of[producer.id]
            return step.in_keys[0]
        return out_key

    @property
    def softmax_stripped(self) -> bool:
        return self.logits_key != self.exec.output_keys[0]

    # ------------------------------------------------------------------------------------------- forward
    def _call_step(self, step: Step, values: dict, rule: Any, training: bool = False) -> list[Any]:
        op = step.operation
        if step.kind == "model":
            out = op([values[k] for k in step.in_keys] if len(step.in_keys) > 1 else values[step.in_keys[0]])
            return keras.tree.flatten(out)
        if step.kind == "activation":
            args, kwargs = (values[step.in_keys[0]],), {}
        else:
            args, kwargs = step.arguments.fill_in(values)
            # Like Keras' Functional: training=True at run time overrides the flag recorded when building.
            if getattr(op, "_call_has_training_arg", False) and (training or "training" not in kwargs):
                kwargs = {**kwargs, "training": training}
        if rule is None:
            return self._plain_call(step, args, kwargs)
        return self._rule_call(step, args, kwargs, rule)

    def _plain_call(self, step: Step, args: tuple, kwargs: dict) -> list[Any]:
        op = step.operation
        if step.kind == "activation":
            return [op.activation(args[0])]
        with linear_activation(op) if step.linear_call else contextlib.nullcontext():
            return keras.tree.flatten(op(*args, **kwargs))

    def _rule_call(self, step: Step, args: tuple, kwargs: dict, rule: Any) -> list[Any]:
        """Wrap one node in ``tf.custom_gradient`` with its tensors and weights as explicit inputs.

        Pitfalls avoided (DESIGN.md): keyword arguments and closure-captured tensors get no gradient, so every
        tensor is passed positionally; weights are read outside and mapped in with a StatelessScope, so no
        variable is read inside the wrapped function.
        """
        op = step.operation
        spec = self.graph.node(step.node_id)
        structure = (args, kwargs)
        leaves = keras.tree.flatten(structure)
        positions = [i for i, leaf in enumerate(leaves) if tf.is_tensor(leaf)]
        xs = [leaves[i] for i in positions]
        variables = [] if step.kind == "activation" else list(getattr(op, "variables", []) or [])
        names = [_weight_name(v) for v in variables]
        weights = [v.value for v in variables]
        n_x = len(xs)

        def forward(xs_: Sequence[Any], ws_: Sequence[Any]) -> list[Any]:
            if step.kind == "activation":
                return [op.activation(xs_[0])]
            new_leaves = list(leaves)
            for i, x in zip(positions, xs_):
                new_leaves[i] = x
            a, k = keras.tree.pack_sequence_as(structure, new_leaves)
            with contextlib.ExitStack() as stack:
                if step.linear_call:
                    stack.enter_context(linear_activation(op))
                if variables:
                    stack.enter_context(keras.StatelessScope(state_mapping=list(zip(variables, ws_))))
                return keras.tree.flatten(op(*a, **k))

        def make_ctx(xs_: list, ys: list, ws_: list) -> RuleContext:
            return RuleContext(spec, op, xs_, ys, ws_, names, forward)

        @tf.custom_gradient
        def wrapped(*flat: Any) -> Any:
            xs_, ws_ = list(flat[:n_x]), list(flat[n_x:])
            ys = forward(xs_, ws_)
            shown = ys
            if type(rule).overrides_forward():
                shown = list(self._guard(rule, spec, "forward_override", make_ctx(xs_, ys, ws_)) or ys)

            def grad_fn(*dys: Any) -> list[Any]:
                dys = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, shown)]
                ctx = make_ctx(xs_, ys, ws_)
                gx = self._guard(rule, spec, "backward", ctx, dys)
                gx = self._check_grads(rule, spec, gx, xs_)
                gw: Any = None
                if ws_:
                    gw = self._guard(rule, spec, "weight_gradients", ctx, dys)
                    gw = list(gw) if gw is not None else ctx.weight_vjp(dys)
                return gx + (gw or [])

            return (shown[0] if len(shown) == 1 else list(shown)), grad_fn

        out = wrapped(*xs, *weights)
        return [out] if tf.is_tensor(out) else list(out)

    @staticmethod
    def _guard(rule: Any, spec: Any, method: str, *args: Any) -> Any:
        try:
            return getattr(rule, method)(*args)
        except GradscopeError:
            raise
        except Exception as exc:
            raise RuleError(
                f"Rule {rule.name!r} failed in {method}() on node {spec.id!r} ({spec.op_type}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    @staticmethod
    def _check_grads(rule: Any, spec: Any, gx: Any, xs: list) -> list[Any]:
        if tf.is_tensor(gx):
            gx = [gx]
        gx = list(gx) if gx is not None else []
        if len(gx) != len(xs):
            raise RuleError(
                f"Rule {rule.name!r} on node {spec.id!r} returned {len(gx)} gradient(s); the node has "
                f"{len(xs)} input tensor(s)."
            )
        checked = []
        for i, (g, x) in enumerate(zip(gx, xs)):
            if g is None or not x.dtype.is_floating:
                checked.append(None)
                continue
            g = tf.convert_to_tensor(g)
            if not g.shape.is_compatible_with(x.shape):
                raise RuleError(
                    f"Rule {rule.name!r} on node {spec.id!r}: gradient {i} has shape {g.shape}, "
                    f"input has shape {x.shape}."
                )
            if g.dtype != x.dtype:
                if not g.dtype.is_floating:
                    raise RuleError(
                        f"Rule {rule.name!r} on node {spec.id!r}: gradient {i} has dtype {g.dtype.name}, "
                        f"input is {x.dtype.name}."
                    )
                g = tf.cast(g, x.dtype)
            checked.append(g)
        return checked

    def _run(
        self, xs: Sequence[Any], rules: dict[str, Any], *, training: bool = False, on_step: Any = None
    ) -> tuple[dict, dict[str, list[Any]]]:
        """The forward pass node by node. ``training``: the flag layers get (True when training with a plan);
        ``on_step(node_id)``: called before each node runs (diagnostics map graph ops to nodes with it)."""
        values: dict[Any, Any] = dict(zip(self.exec.input_keys, xs))
        node_values: dict[str, list[Any]] = {}
        for step in self.exec.steps:
            if step.kind == "alias":
                for src, dst in zip(step.in_keys, step.out_keys):
                    values[dst] = values[src]
                continue
            if on_step is not None:
                on_step(step.node_id)
            outs = self._call_step(step, values, rules.get(step.node_id), training)
            for key, y in zip(step.out_keys, outs):
                values[key] = y
            node_values[step.node_id] = outs
        return values, node_values

    # ------------------------------------------------------------------------------------------- targets
    def _target_scalar(
        self, target: Target, values: dict, node_values: dict, class_idx: Any, labels: Any = None
    ) -> tuple:
        if target.kind == "loss":
            return loss_targets.loss_scalar(self, target, values, labels), tf.zeros([0], tf.int32)
        if target.kind == "class":
            logits = values[self.logits_key]
            if logits.shape.rank != 2:
                raise TargetError(
                    f"A class target needs a (batch, classes) output; the model outputs {logits.shape}. "
                    "Use a neuron or channel target."
                )
            idx = tf.where(class_idx < 0, tf.argmax(logits, axis=-1, output_type=tf.int32), class_idx)
            picked = tf.gather(logits, idx, axis=1, batch_dims=1)
            return tf.reduce_sum(picked), idx
        node_id = target.node or self.graph.output_ids[0]
        self.graph.node(node_id)  # raises GraphError for an unknown id
        if node_id in self.graph.input_ids:
            raise TargetError("The target cannot be a model input.")
        out = node_values[node_id][0]
        if target.kind == "neuron":
            if len(target.neuron) != out.shape.rank - 1:
                raise TargetError(
                    f"Node {node_id!r} output has shape {tuple(out.shape)}; a neuron index needs "
                    f"{out.shape.rank - 1} numbers (no batch axis), got {target.neuron}."
                )
            for i, (n, d) in enumerate(zip(target.neuron, out.shape[1:])):
                if d is not None and not -d <= n < d:
                    raise TargetError(f"Neuron index {target.neuron} is out of range at axis {i + 1} (size {d}).")
            return tf.reduce_sum(out[(slice(None), *target.neuron)]), tf.zeros([0], tf.int32)
        channels = out.shape[-1]
        if channels is not None and not -channels <= target.channel < channels:
            raise TargetError(f"Node {node_id!r} has {channels} channels; channel {target.channel} does not exist.")
        return tf.reduce_sum(out[..., target.channel]), tf.zeros([0], tf.int32)

    # ------------------------------------------------------------------------------------------- tracing
    def _traced(
        self, resolution: Resolution, plan: Plan, target: Target, capture: tuple, weight_grads: bool, stats: bool
    ):
        key = (plan.key(), target.trace_key(), capture, weight_grads, stats)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        rules = {nid: r.rule for nid, r in resolution.rules.items()}
        meta: dict[str, Any] = {}
        overrides_forward = any(type(r).overrides_forward() for r in rules.values())
        # Without statistics only the captured nodes are gradient sources (the cheapest backward pass).
        stat_nodes = self.stat_nodes if stats else [n for n in self.stat_nodes if n in capture]
        meta["stat_nodes"] = stat_nodes if stats else []

        def fn(xs: list, class_idx: Any, labels: Any) -> dict:
            self.trace_count += 1
            plain_values = None
            if overrides_forward:  # the layers above see substituted values: predictions come from a plain run
                plain_values, _ = self._run(xs, {})
                real_logits = plain_values[self.logits_key]
                if target.kind == "class" and real_logits.shape.rank == 2:
                    # "top-1" is the class the user is shown, not the top-1 of the substituted forward
                    top = tf.argmax(real_logits, axis=-1, output_type=tf.int32)
                    class_idx = tf.where(class_idx < 0, top, class_idx)
            with tf.GradientTape() as tape:
                for x in xs:
                    tape.watch(x)
                values, node_values = self._run(xs, rules)
                scalar, idx = self._target_scalar(target, values, node_values, class_idx, labels)
            node_outs = [node_values[n][0] for n in stat_nodes]
            sources = list(xs) + node_outs
            if weight_grads:
                sources += list(self.model.trainable_variables)
            grads = tape.gradient(scalar, sources, unconnected_gradients=tf.UnconnectedGradients.NONE)
            n_in = len(xs)
            input_grads, node_grads = grads[:n_in], grads[n_in : n_in + len(stat_nodes)]
            meta["none_inputs"] = [g is None for g in input_grads]
            meta["none_nodes"] = [n for n, g in zip(stat_nodes, node_grads) if g is None]
            filled_nodes = [tf.zeros_like(o) if g is None else g for g, o in zip(node_grads, node_outs)]
            if plain_values is None:
                plain_values = values
            out = {
                "predictions": plain_values[self.exec.output_keys[0]],
                "logits": plain_values[self.logits_key],
                "idx": idx,
                "loss": scalar,
                "input_grads": [tf.zeros_like(x) if g is None else g for g, x in zip(input_grads, xs)],
                "stats": tf.stack([_stats_row(g) for g in filled_nodes])
                if filled_nodes and stats
                else tf.zeros([0, 6]),
                "captured": {n: filled_nodes[stat_nodes.index(n)] for n in capture},
                "captured_values": {n: node_values[n][0] for n in capture},
            }
            if weight_grads:
                wg = grads[n_in + len(stat_nodes) :]
                out["weight_grads"] = {
                    v.path: (tf.zeros_like(v) if g is None else tf.convert_to_tensor(g))
                    for v, g in zip(self.model.trainable_variables, wg)
                }
                meta["none_weights"] = [v.path for v, g in zip(self.model.trainable_variables, wg) if g is None]
            return out

        # No AutoGraph: the node loop has no tensor-dependent Python control flow, and converting it (and every
        # rule it calls) on each trace cost about 5 s of a 17 s ResNet50 trace. Rules branch with tf.cond.
        traced = (tf.function(fn, reduce_retracing=True, autograph=False), meta)
        with self._lock:
            self._cache[key] = traced
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return traced

    # ------------------------------------------------------------------------------------------- public
    def _as_inputs(self, inputs: Any) -> list[Any]:
        arrays = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if len(arrays) != len(self.exec.input_keys):
            raise TargetError(f"The model takes {len(self.exec.input_keys)} input(s); got {len(arrays)}.")
        out = []
        for a, node_id in zip(arrays, self.graph.input_ids):
            a = np.asarray(a, dtype=np.float32)
            want = self.graph.node(node_id).output_shape
            if a.ndim == len(want) - 1:
                a = a[None]  # a single sample: add the batch axis
            if a.ndim != len(want) or any(w is not None and w != d for w, d in zip(want[1:], a.shape[1:])):
                raise TargetError(f"Input {node_id!r} expects shape {want}, got {a.shape}.")
            out.append(tf.convert_to_tensor(a))
        return out

    def backward(
        self,
        inputs: Any,
        target: Target | None = None,
        plan: Plan | None = None,
        *,
        capture: Sequence[str] | str = (),
        weight_grads: bool = False,
        stats: bool = True,
        labels: Any = None,
    ) -> BackwardResult:
        """One forward + one backward pass under ``plan``; returns numpy results.

        ``capture``: node ids whose full backward signal is brought to the host (``"all"`` for every node);
        ``stats``: per-node statistics of every node (in-graph, cheap; off for the bare input gradient).
        ``weight_grads``: also the gradient of every trainable variable (costs about 1.7x).
        ``labels``: for a loss target (``Target(kind="loss")``), the labels (fed as data: no retrace).
        """
        target = target or Target()
        if target.kind == "loss":
            target = loss_targets.resolve(self, target)
        plan = plan or Plan()
        if capture == "all":
            capture = tuple(self.stat_nodes)
        capture = tuple(dict.fromkeys(capture))
        for node_id in capture:
            if self.graph.node(node_id).is_input:
                raise TargetError(f"{node_id!r} is a model input: read its signal as result.input_grad.")
        resolution = plan.resolve(self.graph)
        xs = self._as_inputs(inputs)
        batch = int(xs[0].shape[0])
        if target.kind == "class":
            n_classes = self._n_classes()
            if target.index is not None and n_classes is not None and not 0 <= target.index < n_classes:
                raise TargetError(f"Class {target.index} does not exist: the model has {n_classes} classes.")
        class_idx = tf.fill([batch], -1 if target.index is None else int(target.index))
        labels_t = loss_targets.prepare_labels(self, target, labels, batch)
        fn, meta = self._traced(resolution, plan, target, capture, weight_grads, stats)
        t0 = time.perf_counter()
        traces_before = self.trace_count
        try:
            out = fn(xs, class_idx, labels_t)
        except LookupError as exc:  # an op without a registered gradient on the path (TF raises LookupError)
            from gradscope.core.errors import GraphError

            raise GraphError(
                f"An operation on the backward path has no registered gradient: {exc}. "
                "Run `gradscope diagnose MODEL` to see which layer it belongs to."
            ) from exc
        elapsed = time.perf_counter() - t0
        none_nodes = set(meta.get("none_nodes", []))
        stats_np = out["stats"].numpy()
        node_stats = {}
        for i, node_id in enumerate(meta["stat_nodes"]):
            node_stats[node_id] = NodeStats.none() if node_id in none_nodes else NodeStats.from_row(stats_np[i])
        result = BackwardResult(
            input_grads=[g.numpy() for g in out["input_grads"]],
            node_grads={k: v.numpy() for k, v in out["captured"].items()},
            node_values={k: v.numpy() for k, v in out["captured_values"].items()},
            stats=node_stats,
            predictions=out["predictions"].numpy(),
            logits=out["logits"].numpy(),
            target_indices=out["idx"].numpy(),
            rules={nid: r.entry.rule for nid, r in resolution.rules.items()},
            inputs=[x.numpy() for x in xs],
            skipped=resolution.skipped,
            unmatched=resolution.unmatched,
            meta={
                "seconds": elapsed,
                "retraced": self.trace_count != traces_before,
                "input_is_none": meta.get("none_inputs", []),
                "softmax_stripped": self.softmax_stripped,
                "target": target.to_dict(),
                "plan": plan.to_dict(),
            },
        )
        if target.kind == "loss":
            result.meta["loss"] = loss_targets.describe(self, target)
            result.meta["loss_value"] = float(out["loss"])
        if weight_grads:
            result.meta["weight_grads"] = {k: v.numpy() for k, v in out["weight_grads"].items()}
            result.meta["none_weights"] = meta.get("none_weights", [])
        return result

    def _n_classes(self) -> int | None:
        shape = self.graph.node(self.graph.output_ids[0]).output_shape
        return shape[-1] if len(shape) == 2 else None

    def predict(self, inputs: Any) -> np.ndarray:
        """The model's real output (what the user sees as predictions)."""
        xs = self._as_inputs(inputs)
        out = self.model(xs[0] if len(xs) == 1 else xs, training=False)
        return np.asarray(out[0] if isinstance(out, (list, tuple)) else out)


def _stats_row(g: Any) -> Any:
    """norm, mean|g|, max|g|, zero fraction, NaN count, Inf count (order of ``STAT_NAMES``).

    Memory-bound: each reduction is a pass over the gradient, so NaN/Inf are counted only when a sum says
    there are any, and max|g| comes from max/min of g (no |g| tensor materialised): about 30% cheaper.
    """
    g = tf.reshape(tf.cast(g, tf.float32), [-1])
    abs_sum = tf.reduce_sum(tf.abs(g))
    sq_sum = tf.reduce_sum(tf.square(g))
    empty = tf.equal(tf.size(g), 0)
    max_abs = tf.cond(empty, lambda: tf.constant(0.0), lambda: tf.maximum(tf.reduce_max(g), -tf.reduce_min(g)))
    size = tf.maximum(tf.cast(tf.size(g), tf.float32), 1.0)
    zeros = tf.reduce_sum(tf.cast(tf.equal(g, 0.0), tf.float32))

    def bad_counts() -> Any:
        nan = tf.reduce_sum(tf.cast(tf.math.is_nan(g), tf.float32))
        return tf.stack([nan, tf.reduce_sum(tf.cast(tf.math.is_inf(g), tf.float32))])

    bad = tf.cond(tf.math.is_finite(abs_sum + sq_sum), lambda: tf.zeros([2]), bad_counts)
    return tf.concat([tf.stack([tf.sqrt(sq_sum), abs_sum / size, max_abs, zeros / size]), bad], axis=0)
