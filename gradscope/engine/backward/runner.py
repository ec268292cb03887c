"""Run a model node by node inside ``tf.function``, wrap planned nodes in their rules, backprop once.

Measured design (see DESIGN.md): the node loop costs nothing inside ``tf.function``; every node's gradient is
captured in ONE ``tape.gradient`` call; statistics are computed in-graph and only the tensors the caller asks
for come back to the host; traced functions are cached per (plan, target kind, captures) so re-running a
plan that was seen before does not retrace.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from gradscope.backend import custom_gradients_released, tf
from gradscope.core.display import RichDisplay
from gradscope.core.errors import Cancelled, GraphError, TargetError
from gradscope.core.graph import LONG_INPUT_TOKENS, LayerGraph
from gradscope.core.results import BackwardResult, LazyArrays, NodeStats
from gradscope.core.targets import Target
from gradscope.engine.backward import loss_targets, token_targets
from gradscope.engine.backward.context import rule_call
from gradscope.engine.backward.keras_graph import ExecGraph, Step, build_exec_graph
from gradscope.engine.backward.kernels import as_missing_kernel, kernels_named
from gradscope.engine.backward.live import LiveBackward, rule_key
from gradscope.engine.backward.node_call import NodeCall, call_arguments, plain_call
from gradscope.engine.backward.stats import stats_rows
from gradscope.engine.backward.weight_checks import weight_problems
from gradscope.io.memory import return_freed_memory
from gradscope.rules.builtin.values import reads_another_input
from gradscope.rules.plan import Plan, Resolution

_CACHE_SIZE = 8  # whole-plan traces kept (each holds a full graph; live sweeps cover the rest)
TRIM_AFTER_SECONDS = 0.5  # a backward pass this long hands its freed memory back (``_trimmed``)


def _is_float_tensor(x: Any) -> bool:
    return tf.is_tensor(x) and x.dtype.is_floating


class Engine(RichDisplay):
    """Backward passes of one Keras model under plans of rules. Never modifies the model.

    >>> engine = Engine(model)
    >>> result = engine.backward(x, Target(index=3), Plan().with_entry("type:ReLU", "guided_backprop"))
    >>> result.input_grad.shape
    """

    _html_maker = "gradscope.app.display.reports:engine_html"  # in a notebook (gradscope.core.display)

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
        self._trace_stop: Any = None  # set while a cancellable compile traces (see ``compile``)
        self.live = LiveBackward(self)
        self._live_steps = all(s.kind in ("call", "activation", "alias") for s in self.exec.steps)  # no opaque model
        self._weight_problems: list[str] | None = None
        self._seen: OrderedDict[tuple, None] = OrderedDict()  # keys answered live once ("auto" compiles at 2nd)
        self._logits_fn: Any = None  # the compiled forward pass of ``logits`` (traced on first use)
        # Whole-plan traces kept; an evaluation that cycles through k methods per batch raises it to k (else
        # every batch would retrace every method: measured 7x slower with 14 methods).
        self.trace_cache_size = _CACHE_SIZE
        self.long_input_tokens = LONG_INPUT_TOKENS

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

    def weight_problems(self) -> list[str]:
        """One line per layer whose weights hold NaN or Inf (``weight_checks``), checked once per engine (the
        engine never changes weights)."""
        if self._weight_problems is None:
            self._weight_problems = weight_problems(self.graph, self._step_of)
        return list(self._weight_problems)

    @property
    def softmax_stripped(self) -> bool:
        return self.logits_key != self.exec.output_keys[0]

    # ------------------------------------------------------------------------------------------- forward
    def _call_step(self, step: Step, values: dict, rule: Any, training: bool = False, source: Any = None) -> list:
        args, kwargs = call_arguments(step, values, training)
        if rule is None:
            return plain_call(step, args, kwargs)
        return rule_call(NodeCall.of(step, args, kwargs), rule, self.graph.node(step.node_id), source)

    def _run(
        self,
        xs: Sequence[Any],
        rules: dict[str, Any],
        *,
        training: bool = False,
        on_step: Any = None,
        transforms: dict[str, Any] | None = None,
        sources: dict[str, Any] | None = None,
        resume: tuple[str, dict] | None = None,
    ) -> tuple[dict, dict[str, list[Any]]]:
        """The forward pass node by node. ``training``: the flag layers get (True when training with a plan);
        ``on_step(node_id)``: called before each node runs (diagnostics map graph ops to nodes with it);
        ``transforms``: node -> ``fn(outputs) -> outputs``, what the layers above see instead (the sanity checks'
        finite differences, a patch, a gradient held back); ``sources``: node -> what its value rule reads from
        another input; ``resume=(node, values)``: only the steps after ``node``, from ``values`` (a run's values by
        key, the node's outputs already replaced: patching reuses what lies below the patched node)."""
        sources, transforms = sources or {}, transforms or {}
        steps = self.exec.steps
        if resume is None:
            values: dict[Any, Any] = dict(zip(self.exec.input_keys, xs))
        else:
            values, steps = resume[1], steps[steps.index(self._step_of[resume[0]]) + 1 :]
        node_values: dict[str, list[Any]] = {}
        for step in steps:
            if step.kind == "alias":
                for src, dst in zip(step.in_keys, step.out_keys):
                    values[dst] = values[src]
                continue
            if on_step is not None:
                on_step(step.node_id)
            if self._trace_stop is not None and not tf.executing_eagerly() and self._trace_stop():
                raise Cancelled("Compilation cancelled: a newer request replaced it.")
            outs = self._call_step(step, values, rules.get(step.node_id), training, sources.get(step.node_id))
            if step.node_id in transforms:
                outs = list(transforms[step.node_id](outs))
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
        if target.kind == "token":
            return token_targets.token_scalar(self, target, values, class_idx)
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

    def token_position(self, target: Target, inputs: Any) -> int:
        """The position a next-token target reads in the first sample of ``inputs`` (what a sidecar reports)."""
        return token_targets.first_position(self, target, self._as_inputs(inputs))

    def is_long_input(self, xs: Sequence[Any]) -> bool:
        """Whether ``xs`` has ``long_input_tokens`` or more tokens: then the live sweep keeps no per-node tapes (they
        held every attention layer's heads x L x L tensors) and ``mode="auto"`` never traces the whole plan (it holds
        every tensor at once). 309 M Llama, 2,048 tokens: AttnLRP 0.93x a plain gradient's peak, was OOM at 24 GB."""
        if self.graph.token_input is None:
            return False
        return int(xs[self.graph.input_ids.index(self.graph.token_input)].shape[1]) >= self.long_input_tokens

    def is_language_model(self) -> bool:
        """The first output is (batch, sequence, vocabulary) logits over token ids: a class target is a token."""
        return self.graph.is_language_model

    # ------------------------------------------------------------------------------------------- tracing
    def _trace_key(self, resolution: Resolution, target: Target, capture: tuple, weight_grads: bool, stats: bool):
        # The rules' code identity is part of the key: reloading an edited rule file must run the new code.
        rules = tuple(sorted((nid, rule_key(r.rule)) for nid, r in resolution.rules.items()))
        return (rules, target.trace_key(), capture, weight_grads, stats)

    def is_compiled(self, plan: Plan, target: Target | None = None, *, capture: Sequence[str] | str = "all") -> bool:
        """Whether ``plan`` (with the Session's capture of every node and statistics) is compiled already."""
        target = target or Target()
        capture = tuple(self.stat_nodes) if capture == "all" else tuple(dict.fromkeys(capture))
        key = self._trace_key(plan.resolve(self.graph), target, capture, False, True)
        with self._lock:
            return key in self._cache and self._cache[key][1].get("traced", False)

    def _traced(
        self, resolution: Resolution, plan: Plan, target: Target, capture: tuple, weight_grads: bool, stats: bool
    ):
        key = self._trace_key(resolution, target, capture, weight_grads, stats)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        rules = resolution.rule_by_node
        meta: dict[str, Any] = {}
        overrides_forward = any(type(r).overrides_forward() for r in rules.values())
        # Without statistics only the captured nodes are gradient sources (the cheapest backward pass).
        stat_nodes = self.stat_nodes if stats else [n for n in self.stat_nodes if n in capture]
        meta["stat_nodes"] = stat_nodes if stats else []

        def fn(xs: list, class_idx: Any, labels: Any, sources: dict) -> dict:
            with custom_gradients_released():
                return trace(xs, class_idx, labels, sources)

        def trace(xs: list, class_idx: Any, labels: Any, sources: dict) -> dict:
            self.trace_count += 1
            meta["traced"] = True
            plain_values = None
            if overrides_forward:  # the layers above see substituted values: predictions come from a plain run
                plain_values, _ = self._run(xs, {})
                real_logits = plain_values[self.logits_key]
                if target.kind == "class" and real_logits.shape.rank == 2:
                    # "top-1" is the class the user is shown, not the top-1 of the substituted forward
                    top = tf.argmax(real_logits, axis=-1, output_type=tf.int32)
                    class_idx = tf.where(class_idx < 0, top, class_idx)
            values, node_values = self._run(xs, rules, sources=sources)
            scalar, idx = self._target_scalar(target, values, node_values, class_idx, labels)
            node_outs = [node_values[n][0] for n in stat_nodes]
            sources = list(xs) + node_outs
            if weight_grads:
                sources += list(self.model.trainable_variables)
            # Symbolic tf.gradients, not a GradientTape: a tape asked for two sources of which one lies above
            # the other (every node's signal) keeps the whole traced graph alive forever (TF 2.21; measured
            # +5 MB per evicted demo-model trace, see tests/engine/backward/test_memory.py). Same gradient registry.
            grads = tf.gradients(scalar, sources, unconnected_gradients=tf.UnconnectedGradients.NONE)
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
                "stats": stats_rows(filled_nodes) if stats else tf.zeros([0, 6]),
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
            while len(self._cache) > self.trace_cache_size:
                self._cache.popitem(last=False)
        return traced

    # ------------------------------------------------------------------------------------------- public
    def _as_inputs(self, inputs: Any) -> list[Any]:
        return [tf.convert_to_tensor(a) for a in self.checked_inputs(inputs)]

    def checked_inputs(self, inputs: Any) -> list[np.ndarray]:
        """The model's inputs as float32 arrays with a batch axis, or a ``TargetError`` naming the input whose
        count, shape or dtype does not fit (strings, objects and complex numbers are refused, never cast)."""
        arrays = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if len(arrays) != len(self.exec.input_keys):
            raise TargetError(f"The model takes {len(self.exec.input_keys)} input(s); got {len(arrays)}.")
        out = []
        for a, node_id in zip(arrays, self.graph.input_ids):
            a = np.asarray(a)
            if a.dtype.kind not in "biuf":
                raise TargetError(f"Input {node_id!r} must hold real numbers; got an array of {a.dtype} ({a.shape}).")
            a = a.astype(np.float32, copy=False)
            want = self.graph.node(node_id).output_shape
            if a.ndim == len(want) - 1:
                a = a[None]  # a single sample: add the batch axis
            if a.ndim != len(want) or any(w is not None and w != d for w, d in zip(want[1:], a.shape[1:])):
                raise TargetError(f"Input {node_id!r} expects shape {want}, got {a.shape}.")
            out.append(a)
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
        classes: Any = None,
        mode: str = "auto",
        alternate: Any = None,
    ) -> BackwardResult:
        """One forward + one backward pass under ``plan``; returns numpy results.

        ``capture``: node ids whose full backward signal is brought to the host (``"all"`` for every node);
        ``stats``: per-node statistics of every node (in-graph, cheap; off for the bare input gradient).
        ``weight_grads``: also the gradient of every trainable variable (costs about 1.7x).
        ``labels``: for a loss target (``Target(kind="loss")``), the labels (fed as data: no retrace).
        ``classes``: for a class target, one class index per sample (-1: that sample's top-1), in place of
        ``target.index`` (fed as data: one trace serves every mix of classes).
        ``alternate``: another input (a batch of the same shape, or one sample), for the value rules of the plan that
        read a node's value there (``substitute_value`` / ``patch_value`` with source "input" or "mean").
        ``mode``: ``"compiled"`` traces the whole plan once (fastest from the second call on; a trace costs
        seconds on a large model); ``"live"`` answers at once with a node-by-node sweep that reuses the last
        sweep's work (see ``gradscope.engine.backward.live``); ``"auto"`` (default) uses a compiled trace when there is
        one, answers a plan seen for the first time live, and compiles it when it comes back if it asks for the
        bare gradient (``stats=False``, one captured node at most); with statistics or every node's signal it stays
        live until ``compile()`` traces it (a trace that large costs 6-10 live answers).
        """
        if mode not in ("auto", "live", "compiled"):
            raise ValueError(f"mode must be 'auto', 'live' or 'compiled', not {mode!r}")
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
        if target.kind == "class" and self.is_language_model():  # a language model's "class" is the next token
            target = target.as_token()
        if target.kind == "token":
            length = xs[self.graph.input_ids.index(self.graph.token_input)].shape[1] if self.graph.token_input else None
            target.check_token(self.graph.node(self.graph.output_ids[0]).output_shape[-1], length)
        target.check_class(self.graph.class_count())
        if classes is None:
            class_idx = tf.fill([batch], -1 if target.index is None else int(target.index))
        else:
            class_idx = tf.constant(self._checked_classes(classes, batch, target))
        live_ok = self.live_supported(resolution, target, weight_grads)
        long = live_ok and self.is_long_input(xs)
        if mode == "live" and not live_ok:
            mode = "compiled"  # forward-changing rules, loss targets, weight gradients: the whole-plan path
        if mode == "auto":
            key = self._trace_key(resolution, target, capture, weight_grads, stats)
            with self._lock:
                compiled = key in self._cache
                seen = key in self._seen
                self._seen[key] = None
                while len(self._seen) > 256:
                    self._seen.popitem(last=False)
            # A second call compiles only a trace about as cheap as a live answer: the bare gradient (no
            # statistics, one node at most). Every node's signal and statistics as sources made the trace 6-10x a
            # live answer (1 B Llama AttnLRP: 17 s against 2.7 s; ResNet50: 3.9 s against 0.4 s): such a plan
            # stays live until ``compile`` traces it (the window's background step).
            cheap = not stats and len(capture) <= 1
            mode = "live" if long else "compiled" if compiled or (seen and cheap) or not live_ok else "live"
        if mode == "live":
            return _trimmed(self._backward_live(xs, target, plan, resolution, class_idx, capture, stats))
        labels_t = loss_targets.prepare_labels(self, target, labels, batch)
        sources = self._value_sources(resolution, alternate)
        fn, meta = self._traced(resolution, plan, target, capture, weight_grads, stats)
        t0 = time.perf_counter()
        traces_before = self.trace_count
        try:
            out = fn(xs, class_idx, labels_t, sources)
        except LookupError as exc:  # an op without a registered gradient on the path (TF raises LookupError)
            raise GraphError(
                f"An operation on the backward path has no registered gradient: {exc}. "
                "Run `gradscope diagnose MODEL` to see which layer it belongs to."
            ) from exc
        except BaseException as exc:
            self._forget(fn)
            missing = as_missing_kernel(exc, self.graph)
            if missing is not None:
                raise missing from exc
            if self.graph.notes and isinstance(exc, (TypeError, ValueError)) and not self._live_steps:
                # an opaque subclassed model whose call() only runs on concrete values (see keras_graph)
                raise GraphError(
                    f"{self.graph.notes[0]} Its call() does not run inside tf.function either "
                    f"({type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}), so gradscope cannot take "
                    "its gradient."
                ) from exc
            raise
        elapsed = time.perf_counter() - t0
        none_nodes = set(meta.get("none_nodes", []))
        stats_np = out["stats"].numpy()
        node_stats = {}
        for i, node_id in enumerate(meta["stat_nodes"]):
            node_stats[node_id] = NodeStats.none() if node_id in none_nodes else NodeStats.from_row(stats_np[i])
        result = self._result(
            xs,
            resolution,
            plan,
            target,
            input_grads=[g.numpy() for g in out["input_grads"]],
            node_grads=LazyArrays(out["captured"]),  # copied to numpy when read (see LazyArrays)
            node_values=LazyArrays(out["captured_values"]),
            stats=node_stats,
            predictions=out["predictions"].numpy(),
            logits=out["logits"].numpy(),
            idx=out["idx"].numpy(),
            meta={
                "seconds": elapsed,
                "retraced": self.trace_count != traces_before,
                "mode": "compiled",
                "input_is_none": meta.get("none_inputs", []),
            },
        )
        if target.kind == "loss":
            result.meta["loss"] = loss_targets.describe(self, target)
            result.meta["loss_value"] = float(out["loss"])
        if weight_grads:
            result.meta["weight_grads"] = {k: v.numpy() for k, v in out["weight_grads"].items()}
            result.meta["none_weights"] = meta.get("none_weights", [])
        return _trimmed(result)

    def _value_sources(self, resolution: Resolution, alternate: Any) -> dict[str, Any]:
        """Node -> its value on ``alternate``, for the plan's value rules that read another input (one forward of
        it); {} without one (a rule that needs it says so when it runs)."""
        wanted = [nid for nid, r in resolution.rules.items() if reads_another_input(r.rule)]
        if not wanted or alternate is None:
            return {}
        _, node_values = self._run(self._as_inputs(alternate), {})
        return {nid: node_values[nid][0] for nid in wanted}

    def _checked_classes(self, classes: Any, batch: int, target: Target) -> np.ndarray:
        if target.kind != "class":
            raise TargetError(f"Per-sample classes need a class target, not a {target.kind} target.")
        idx = np.asarray(classes)
        if idx.shape != (batch,) or (idx.size and idx.dtype.kind not in "iu"):
            raise TargetError(f"classes must hold one whole number per sample ({batch}), got {idx.dtype} {idx.shape}.")
        count = self.graph.class_count()
        if count and idx.size and (idx.max() >= count or idx.min() < -1):
            raise TargetError(f"A class index is out of range: the model has {count} classes (-1: top-1).")
        return idx.astype(np.int32)

    def live_supported(self, resolution: Resolution, target: Target, weight_grads: bool = False) -> bool:
        """Whether a live sweep gives this pass (else it takes the whole-plan path)."""
        return (
            target.kind in ("class", "token", "neuron", "channel")
            and not weight_grads
            and not any(type(r.rule).changes_values() for r in resolution.rules.values())
            and self._live_steps
        )

    def _backward_live(
        self, xs: list, target: Target, plan: Plan, resolution: Resolution, class_idx: Any, capture: tuple, stats: bool
    ) -> BackwardResult:
        t0 = time.perf_counter()
        rules = resolution.rule_by_node
        sweep = self.live.sweep(xs, target, class_idx, rules, should_stop=self._trace_stop)
        values = self.live.forward(xs).values
        node_stats: dict[str, NodeStats] = {}
        if stats:
            for node_id in self.stat_nodes:
                row = sweep.stats.get(node_id)
                node_stats[node_id] = NodeStats.none() if row is None else NodeStats.from_row(np.asarray(row))

        def signal(node_id: str) -> Any:
            got = sweep.arrived.get(node_id)
            if got is not None:
                return got[0]
            value = values[self.exec.node_out_keys[node_id][0]]
            return np.zeros(value.shape, value.dtype.as_numpy_dtype)

        result = self._result(
            xs,
            resolution,
            plan,
            target,
            input_grads=[_numpy_or_zeros(g, x) for g, x in zip(sweep.input_grads, xs)],
            node_grads=LazyArrays({n: signal(n) for n in capture}),  # copied when read, as the compiled path
            node_values=LazyArrays({n: values[self.exec.node_out_keys[n][0]] for n in capture}),
            stats=node_stats,
            predictions=values[self.exec.output_keys[0]].numpy(),
            logits=values[self.logits_key].numpy(),
            idx=np.asarray(sweep.idx),
            meta={
                "seconds": time.perf_counter() - t0,
                "retraced": False,
                "mode": "live",
                "recomputed_nodes": sweep.recomputed,
                "compiled_nodes": sweep.compiled,
                "lowered_nodes": sweep.lowered,
                "eager_nodes": sweep.eager,
                "input_is_none": [g is None for g in sweep.input_grads],
            },
        )
        return result

    def _result(
        self,
        xs,
        resolution,
        plan,
        target,
        *,
        input_grads,
        node_grads,
        node_values,
        stats,
        predictions,
        logits,
        idx,
        meta,
    ) -> BackwardResult:
        return BackwardResult(
            input_grads=input_grads,
            node_grads=node_grads,
            node_values=node_values,
            stats=stats,
            predictions=predictions,
            logits=logits,
            target_indices=idx,
            rules={nid: r.entry.rule for nid, r in resolution.rules.items()},
            inputs=[x.numpy() for x in xs],
            skipped=resolution.skipped,
            unmatched=resolution.unmatched,
            meta={
                **meta,
                **(
                    {"token_position": token_targets.first_position(self, target, xs)} if target.kind == "token" else {}
                ),
                "weight_problems": self.weight_problems(),
                "softmax_stripped": self.softmax_stripped,
                "target": target.to_dict(),
                "plan": plan.to_dict(),
            },
        )

    def _forget(self, fn: Any) -> None:
        """Drop a trace that failed or was cancelled half-way (it must be traced again next time)."""
        with self._lock:
            for k, (f, _) in list(self._cache.items()):
                if f is fn:
                    del self._cache[k]

    def compile(
        self,
        inputs: Any,
        target: Target | None = None,
        plan: Plan | None = None,
        *,
        capture: Sequence[str] | str = "all",
        should_stop: Any = None,
    ) -> bool:
        """Trace and run the whole plan once (the steady state), stopping between nodes when ``should_stop()``
        (raises ``Cancelled``); also compiles the live kernels of the plan. Returns False if it was compiled
        already. Used by the Session in the background after a live answer."""
        target = target or Target()
        plan = plan or Plan()
        resolution = plan.resolve(self.graph)
        rules = resolution.rule_by_node
        live_ok = self.live_supported(resolution, target)
        if live_ok:
            self.live.warm(rules, should_stop)
        if self.is_compiled(plan, target, capture=capture):
            return False
        if live_ok and self.is_long_input(self._as_inputs(inputs)):
            return False  # a long prompt stays live: a whole-plan trace holds every tensor of the pass at once
        self._trace_stop = should_stop
        try:
            self.backward(inputs, target, plan, capture=capture, mode="compiled")
        finally:
            self._trace_stop = None
        return True

    def prepare(self, plan: Plan, target: Target | None = None, *, should_stop: Any = None) -> int:
        """Compile the block kernels ``plan`` would run live on the last input, nothing else (no whole-plan
        trace): a plan the user may pick next, e.g. a preset of the method menu, answers at block-kernel speed
        the first time. Returns how many kernels were compiled (0 when the plan is not answered live)."""
        resolution = plan.resolve(self.graph)
        if not self.live_supported(resolution, target or Target()):
            return 0
        return self.live.warm(resolution.rule_by_node, should_stop, nodes=False, prepared=True)

    def logits(self, inputs: Any) -> np.ndarray:
        """The model's pre-softmax output (what a class target differentiates) for a batch, compiled once per
        engine (the evaluation's perturbed copies: thousands of forward passes)."""
        xs = self._as_inputs(inputs)
        with self._lock:
            if self._logits_fn is None:
                self._logits_fn = tf.function(
                    lambda xs: self._run(xs, {})[0][self.logits_key], reduce_retracing=True, autograph=False
                )
        return self._logits_fn(xs).numpy()

    def predict(self, inputs: Any) -> np.ndarray:
        """The model's real output (what the user sees as predictions)."""
        xs = self._as_inputs(inputs)
        # keras_hub's language models take {"token_ids": ..., "padding_mask": ...}; the graph's inputs are that
        # dict flattened, by sorted key
        structure = getattr(self.model, "input", None)
        feed = dict(zip(sorted(structure), xs)) if isinstance(structure, dict) else xs[0] if len(xs) == 1 else xs
        with kernels_named(self.graph):
            out = self.model(feed, training=False)
        return np.asarray(out[0] if isinstance(out, (list, tuple)) else out)


def _trimmed(result: BackwardResult) -> BackwardResult:
    """``result``, after a long pass the memory it freed handed back (``return_freed_memory``: up to 35 ms)."""
    if result.meta.get("seconds", 0.0) >= TRIM_AFTER_SECONDS:
        return_freed_memory()
    return result


def _numpy_or_zeros(g: Any, like: Any) -> np.ndarray:
    return np.zeros(like.shape, like.dtype.as_numpy_dtype) if g is None else g.numpy()
