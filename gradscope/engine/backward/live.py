"""Live backward passes: answer a never-seen plan without tracing the whole model.

Measured on ResNet50 224x224 batch 1 (2-core CPU; a compiled plain gradient takes 0.165 s): tracing a whole
plan costs 3-8 s, and running the engine eagerly 2 s. An edit changes one node, so this module

1. keeps the forward values of the current input (one plain forward per input: nothing to trace);
2. runs the backward pass node by node, in reverse, each node turning the signal at its outputs into
   contributions to its inputs (its rule, or its true VJP);
3. keeps every node's contributions of the last sweep and recomputes a node only when its rule changed or
   the signal arriving at it did: an edit recomputes the edited node and the nodes below it, nothing above;
4. runs a node's true gradient as its *lowered* VJP where the layer is lowered (``engine.backward.lowered``: one or two
   raw ops, no kernel needed; ResNet50: every node but the classifier), else each node through a small
   compiled *kernel*, shared by every node with the same layer config, shapes and rule, or eagerly while that
   kernel is not compiled yet. ``LiveBackward.warm`` compiles the missing kernels of a plan; the Session does
   it in the background and a newer edit cancels it;
5. runs a run of nodes with one exit tensor as one compiled *block kernel* once ``warm`` traced it for the
   rules it holds (``engine.backward.segments``: a full ResNet50 sweep 1.05-1.2x a plain gradient instead of
   1.6-1.7x; the MWP preset 1.4x instead of 2.5x with per-node kernels).
   Statistics of eagerly run nodes are computed by NumPy on the signal's memory (``stats.stats_row``).

The sweep gives what one ``tape.gradient`` of the rule-wrapped model gives (tests check 1e-6 for every
built-in rule), for plans whose rules do not change the forward values (``forward_override``); those, loss
targets and weight gradients go through the whole-plan path (``Engine.backward(mode="compiled")``).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradscope.backend import input_only_conv_gradients, keras, tape_vjp, tf
from gradscope.core.errors import Cancelled
from gradscope.core.targets import Target
from gradscope.engine.backward.context import RuleContext, checked_grads, guarded
from gradscope.engine.backward.keras_graph import Step
from gradscope.engine.backward.kernels import kernels_named
from gradscope.engine.backward.node_call import NodeCall, call_arguments, plain_call
from gradscope.engine.backward.segments import (
    KernelPool,
    Segment,
    build_kernel,
    find_segments,
    segment_arguments,
    unpack,
)
from gradscope.engine.backward.stats import stats_row
from gradscope.rules.base import params_to_dict

_KERNEL_CACHE_SIZE = 1024  # eager kernels (closures, cheap)
_COMPILED_KERNELS = 128  # of which traced (about 1 MB each)
# traced block kernels (per distinct block, input shape and rules; 1-6 MB each), for the shown plans (an edit makes
# one) and for the prepared presets (5 presets x a model's distinct blocks)
_SHOWN_BLOCK_KERNELS = 32
_PREPARED_BLOCK_KERNELS = 64


def rule_key(rule: Any) -> tuple | None:
    """What decides a node's backward: the rule's class (its identity: a reloaded rule file is new code) and
    its parameters. None for the true gradient."""
    if rule is None:
        return None
    params = json.dumps(params_to_dict(rule.params), sort_keys=True, default=str)
    return (type(rule).__module__, type(rule).__qualname__, id(type(rule)), params)


def _layer_signature(step: Step) -> Any:
    """Nodes with equal signatures can share a kernel: same Keras class and config (built-in layers only; a
    custom layer may depend on more than its config, so it gets a kernel of its own)."""
    op = step.operation
    if not type(op).__module__.startswith("keras."):
        return ("layer", id(op))
    try:
        cfg = {k: v for k, v in op.get_config().items() if k != "name"}
        text = json.dumps(cfg, sort_keys=True, default=repr)
    except Exception:  # noqa: BLE001 - a config we cannot read: no sharing
        return ("layer", id(op))
    if step.kind == "activation":
        return ("activation", text)
    return (type(op).__module__, type(op).__qualname__, text, step.linear_call)


def _spec_of(x: Any) -> tuple:
    return (tuple(x.shape), x.dtype.name) if tf.is_tensor(x) else ("py", repr(x))


@dataclass
class _Recorded:
    """One node's forward call recorded on its own persistent tape: the node's true VJP for any signal, without
    calling the layer again (Keras' eager layer call is a third of a cold node's cost). One tape per node, not
    one for the model: ``tape.gradient`` walks the whole tape, so on one model-wide tape a late node's VJP
    took 270 ms (ResNet50)."""

    tape: Any
    xs: list[Any]  # the watched copies of the node's float inputs (None: not float)
    outs: list[Any]

    def vjp(self, dys: Sequence[Any]) -> list[Any]:
        sources = [x for x in self.xs if x is not None]
        got = iter(tape_vjp(self.tape, self.outs, sources, list(dys)))
        return [None if x is None else next(got) for x in self.xs]


def _recorded_call(call: NodeCall) -> tuple[list[Any], _Recorded | None]:
    """Run ``call`` as the model would, recording it for ``_Recorded.vjp`` when its inputs are float."""
    xs = call.xs
    if not any(x.dtype.is_floating for x in xs):
        return plain_call(call.step, *call.structure), None
    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as tape:
        # copies: a tensor used twice by the node gets one gradient per use (see context.vjp)
        watched = [tf.identity(x) if x.dtype.is_floating else None for x in xs]
        for x in watched:
            if x is not None:
                tape.watch(x)
        leaves = list(call.leaves)
        for i, x, w in zip(call.positions, xs, watched):
            leaves[i] = x if w is None else w
        args, kwargs = keras.tree.pack_sequence_as(call.structure, leaves)
        outs = plain_call(call.step, args, kwargs)
    return outs, _Recorded(tape, watched, outs)


def _tape_vjp(forward: Callable[[list, list], list], xs: list, ws: list, dys: list) -> list:
    """The true VJP of ``forward(xs, ws)`` by a tape over it, one gradient per x (None: not float or not connected)."""
    xs = [tf.identity(x) for x in xs]  # a tensor used twice gets one gradient per use (see context.vjp)
    float_xs = [x for x in xs if x.dtype.is_floating]
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        for x in float_xs:
            tape.watch(x)
        outs = forward(xs, ws)
    got = iter(tape.gradient(outs, float_xs, output_gradients=dys))
    return [next(got) if x.dtype.is_floating else None for x in xs]


def _true_vjp(call: NodeCall) -> Callable[[list, list, list, list], list]:
    """A node's true VJP ``(xs, ys, ws, dys) -> dxs`` for a kernel: its lowered VJP, else a tape over its call."""
    if call.lowered is not None:
        return call.lowered.vjp
    return lambda xs, ys, ws, dys: _tape_vjp(call.forward, xs, ws, dys)


def _call_flat(compiled: Any, args: list) -> Any:
    """Call a concrete function on its flat tensor list, without matching each argument against its signature
    (~20 us a tensor: 15 ms of a ResNet50 sweep's 760). The caller's key fixes every spec already; TensorFlow
    versions without the private entry point take the checked call."""
    flat = getattr(compiled, "_call_flat", None)
    if flat is None:
        return compiled(args[0], args[1:])
    return flat(args, compiled.captured_inputs)


@dataclass
class _LoweredVJP:
    """A lowered node's true VJP (``engine.backward.lowered``): the op TensorFlow's gradient runs, with no tape."""

    call: NodeCall
    outs: list[Any]

    def vjp(self, dys: Sequence[Any]) -> list[Any]:
        return self.call.lowered.vjp(self.call.xs, self.outs, self.call.weights(), dys)  # type: ignore[union-attr]


def _forward_call(call: NodeCall, record: bool = True) -> tuple[list[Any], _Recorded | _LoweredVJP | None]:
    """Run ``call`` as the model would: as raw ops where it is lowered, else through Keras on a tape (``record``;
    without it the node's true VJP runs its call again under a tape of its own: a long prompt's memory)."""
    if call.lowered is None:
        return _recorded_call(call) if record else (plain_call(call.step, *call.structure), None)
    outs = call.lowered.forward(call.xs, call.weights())
    return outs, _LoweredVJP(call, outs)


@dataclass
class _Forward:
    """The plain forward values of one input batch, each node's call on them and its recorded VJP."""

    key: str
    values: dict[Any, Any]
    calls: dict[str, NodeCall]
    tapes: dict[str, _Recorded | _LoweredVJP | None]  # each node's true VJP for a cold backward
    seeds: dict[tuple, tuple[dict[Any, Any], Any]] = field(default_factory=dict)  # by target (``_seeds``)


@dataclass
class _Memo:
    """The last sweep on the current forward values (a new input drops it): each node's rule key, its
    contributions to its input keys and its statistics row."""

    target_key: tuple
    rule_keys: dict[str, Any]
    contributions: dict[str, list[tuple[Any, Any]]]
    stats: dict[str, Any]


@dataclass
class SweepResult:
    input_grads: list[Any]  # signal at each model input (None: not connected)
    arrived: dict[str, list[Any]]  # node id -> signal at each of its outputs (absent: none arrives)
    stats: dict[str, np.ndarray | None]  # node id -> stats row (None: no signal reaches the node)
    recomputed: int
    compiled: int  # nodes that ran through a compiled kernel
    lowered: int  # nodes whose true gradient ran as lowered ops (they need no kernel)
    eager: int  # nodes that ran eagerly while their kernel was not compiled
    idx: Any


class LiveBackward:
    """The per-engine state of live sweeps (forward values, last sweep, kernels). Not thread-safe: the
    Session drives one engine from one worker thread."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._forward: _Forward | None = None
        self._memo: _Memo | None = None
        # kernel key -> (eager fn, tf.function; its concrete function once traced)
        self._kernels: OrderedDict[tuple, Any] = OrderedDict()
        self._ready: OrderedDict[tuple, None] = OrderedDict()  # kernel keys whose tf.function is traced (LRU)
        self._signatures: dict[str, Any] = {}  # node id -> _layer_signature (a config never changes)
        self._segments: dict[int, Segment] | None = None  # last step index -> segment (``engine.backward.segments``)
        self._segment_kernels = KernelPool(_SHOWN_BLOCK_KERNELS, _PREPARED_BLOCK_KERNELS)  # traced, by segment key
        self._segment_keys: dict[tuple, tuple] = {}  # (last step, its rule keys) -> segment key, current forward
        self._failed_segments: set[tuple] = set()  # keys whose trace failed: those segments run node by node
        self._weights: dict[str, list] = {}  # node id -> its weights' values, read once (forget() drops them)

    def forget(self) -> None:
        """Drop the cached forward values and the last sweep (the model's weights changed)."""
        self._forward = None
        self._memo = None
        self._weights = {}

    # ------------------------------------------------------------------------------------------- forward
    def forward(self, xs: Sequence[Any]) -> _Forward:
        digest = hashlib.sha1()
        for x in xs:
            a = x.numpy()
            digest.update(repr((a.shape, a.dtype.str)).encode())
            digest.update(a.tobytes())
        key = digest.hexdigest()
        if self._forward is not None and self._forward.key == key:
            return self._forward
        self._memo = None
        self._forward = None  # the old values and tapes go before the new ones are made
        self._segment_keys = {}
        record = not self.engine.is_long_input(xs)
        values: dict[Any, Any] = dict(zip(self.engine.exec.input_keys, xs))
        calls: dict[str, NodeCall] = {}
        tapes: dict[str, _Recorded | _LoweredVJP | None] = {}
        for step in self.engine.exec.steps:
            if step.kind == "alias":
                for src, dst in zip(step.in_keys, step.out_keys):
                    values[dst] = values[src]
                continue
            args, kwargs = call_arguments(step, values)
            call = calls[step.node_id] = NodeCall.of(step, args, kwargs)
            with kernels_named(self.engine.graph, step.node_id):
                outs, tapes[step.node_id] = _forward_call(call, record)
            for k, y in zip(step.out_keys, outs):
                values[k] = y
        self._forward = _Forward(key, values, calls, tapes)
        return self._forward

    # ------------------------------------------------------------------------------------------- kernels
    def _kernel_key(self, call: NodeCall, rule: Any) -> tuple:
        # A user's rule may read ctx.node.id: only the true gradient and built-in rules share kernels.
        node_id = call.step.node_id
        shared = rule is None or type(rule).__module__.startswith("gradscope.rules.builtin")
        if shared and node_id not in self._signatures:
            self._signatures[node_id] = _layer_signature(call.step)
        return (
            self._signatures[node_id] if shared else ("node", node_id, id(call.step.operation)),
            call.step.kind,
            tuple(_spec_of(x) for x in call.leaves),
            tuple((tuple(v.shape), str(v.dtype)) for v in call.variables),
            rule_key(rule),
        )

    def _node_vjp(self, call: NodeCall, rule: Any) -> Callable[[list, list, list, list], list]:
        """``(xs, ys, ws, dys) -> dxs`` (None: no contribution) for ``call``'s node under ``rule``: its true VJP,
        or the rule's backward. The function closes over ``call`` (the representative node): another node with
        the same kernel key passes its own tensors and weights, mapped onto the representative's variables."""
        call = call.template()
        if rule is None:
            return _true_vjp(call)
        engine = self.engine
        spec = engine.graph.node(call.step.node_id)
        op, names, lowered = call.step.operation, call.weight_names, call.lowered

        def forward(xs_: Sequence[Any], ws_: Sequence[Any]) -> list[Any]:
            return call.forward(xs_, ws_)

        def vjp(xs: list, ys: list, ws: list, dys: list) -> list:
            xs, ys, ws, dys = list(xs), list(ys), list(ws), list(dys)
            true_vjp = None if lowered is None else (lambda ws_, dys_: lowered.vjp(xs, ys, ws_, dys_))
            ctx = RuleContext(spec, op, xs, ys, ws, names, forward, call.pack, true_vjp)
            return checked_grads(rule, spec, guarded(rule, spec, "backward", ctx, dys), xs)

        return vjp

    def _node_backward(self, call: NodeCall, rule: Any) -> Callable[..., Any]:
        """``fn(xs, ys, ws, dys) -> (grads per x, presence flags, stats row of dys[0])``: a node's kernel."""
        vjp = self._node_vjp(call, rule)

        def fn(xs: list, ys: list, ws: list, dys: list) -> Any:
            gx = vjp(xs, ys, ws, dys)
            present = tf.constant([g is not None for g in gx], tf.bool)
            return [tf.zeros_like(x) if g is None else g for g, x in zip(gx, xs)], present, stats_row(dys[0])

        return fn

    def _kernel(self, call: NodeCall, rule: Any) -> tuple[tuple, Callable[..., Any], bool]:
        key = self._kernel_key(call, rule)
        entry = self._kernels.get(key)
        if entry is None:
            eager = self._node_backward(call, rule)
            entry = (eager, tf.function(eager, autograph=False))
            self._kernels[key] = entry
            while len(self._kernels) > _KERNEL_CACHE_SIZE:
                old, _ = self._kernels.popitem(last=False)
                self._ready.pop(old, None)
        self._kernels.move_to_end(key)
        ready = key in self._ready
        if ready:
            self._ready.move_to_end(key)
        return key, entry, ready

    def _mark_ready(self, key: tuple) -> None:
        """Keep at most ``_COMPILED_KERNELS`` traced kernels: a traced graph costs about 1 MB, and a parameter
        sweep (a new ``scale`` factor per edit) makes a new kernel per edit that is rarely used again. The
        least recently used one goes back to an untraced tf.function (its graph is freed; it runs eagerly
        until it is compiled again)."""
        self._ready[key] = None
        while len(self._ready) > _COMPILED_KERNELS:
            old, _ = self._ready.popitem(last=False)
            if old in self._kernels:
                eager, _compiled = self._kernels[old]
                self._kernels[old] = (eager, tf.function(eager, autograph=False))

    def _run_node(self, call: NodeCall, rule: Any, dys: list) -> tuple[list, Any, Any, str]:
        """The node's contributions and how they ran: its lowered VJP (true gradient of a lowered layer), its
        compiled kernel if it is ready, else eagerly (the true VJP from the node's recorded tape)."""
        with kernels_named(self.engine.graph, call.step.node_id):
            return self._node_contributions(call, rule, dys)

    def _node_contributions(self, call: NodeCall, rule: Any, dys: list) -> tuple[list, Any, Any, str]:
        fwd = self._forward
        recorded = fwd.tapes.get(call.step.node_id) if rule is None else None  # type: ignore[union-attr]
        # A lowered VJP (an op or two, stats by NumPy) beats the compiled kernel; a recorded one runs until the
        # kernel is compiled. Until something is compiled, skip the kernel key (0.15 s on ResNet50).
        if recorded is not None and (
            isinstance(recorded, _LoweredVJP) or not self._ready or self._kernel_key(call, rule) not in self._ready
        ):
            gx = recorded.vjp(dys)
            how = "lowered" if isinstance(recorded, _LoweredVJP) else "eager"
            return gx, [g is not None for g in gx], stats_row(dys[0]), how
        _, (eager, compiled), ready = self._kernel(call, rule)
        ys = [fwd.values[k] for k in call.step.out_keys]  # type: ignore[union-attr]
        gx, present, row = (compiled if ready else eager)(call.xs, ys, call.weights(), dys)
        # one host copy: indexing the tensor per input was an eager slice op each (0.1 s per ResNet50 sweep)
        return gx, present.numpy().tolist(), row, "compiled" if ready else "eager"

    # ------------------------------------------------------------------------------------------- sweep
    def sweep(
        self,
        xs: Sequence[Any],
        target: Target,
        class_idx: Any,
        rules: dict[str, Any],
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> SweepResult:
        """One backward pass under ``rules`` (node id -> Rule), reusing the last sweep where nothing changed.
        Nodes whose kernel is not compiled yet run eagerly (``warm`` compiles them)."""
        with input_only_conv_gradients():  # the eager VJPs need no filter gradients
            return self._sweep(xs, target, class_idx, rules, should_stop)

    def _sweep(
        self,
        xs: Sequence[Any],
        target: Target,
        class_idx: Any,
        rules: dict[str, Any],
        should_stop: Callable[[], bool] | None,
    ) -> SweepResult:
        engine = self.engine
        fwd = self.forward(xs)
        values = fwd.values
        # the target's gradient depends on the forward values only: one per input and target (8 ms a ResNet50 edit)
        seed_key = (target, None if class_idx is None else tuple(np.asarray(class_idx).ravel().tolist()))
        if seed_key not in fwd.seeds:
            if len(fwd.seeds) >= 16:  # a neuron target's seed is a layer's size: keep a few
                fwd.seeds.clear()
            fwd.seeds[seed_key] = self._seeds(target, values, class_idx)
        seeds, idx = fwd.seeds[seed_key]
        target_key = (target.trace_key(), tuple(np.asarray(idx).ravel().tolist()))
        memo = self._memo if self._memo and self._memo.target_key == target_key else None
        grads: dict[Any, Any] = dict(seeds)
        dirty: set[Any] = set()
        contributions: dict[str, list[tuple[Any, Any]]] = {}
        arrived: dict[str, list[Any]] = {}  # node id -> signal at each of its outputs
        rule_keys: dict[str, Any] = {}
        stats: dict[str, Any] = {}
        ran = {"compiled": 0, "lowered": 0, "eager": 0, "recomputed": 0}
        state = (grads, dirty, contributions, arrived, rule_keys, stats, ran)
        steps = engine.exec.steps
        below = len(steps)  # steps from here on were run by a block kernel
        for i in range(len(steps) - 1, -1, -1):
            if i >= below:
                continue
            segment = self.segments().get(i) if self._segment_kernels else None
            if segment is not None and self._run_segment(segment, rules, memo, state, should_stop):
                below = segment.first
                continue
            step = steps[i]
            if step.kind == "alias":
                for src, dst in zip(step.in_keys, step.out_keys):
                    g = grads.pop(dst, None)
                    if g is not None:
                        grads[src] = g if src not in grads else grads[src] + g
                        if dst in dirty:
                            dirty.add(src)
                continue
            node_id = step.node_id
            rule = rules.get(node_id)
            rk = rule_keys[node_id] = rule_key(rule)
            dys = [grads.get(k) for k in step.out_keys]
            if all(d is None for d in dys):
                stats[node_id] = None
                contributions[node_id] = []
                continue
            outs = [values[k] for k in step.out_keys]
            dys = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, outs)]
            arrived[node_id] = dys
            reuse = (
                memo is not None
                and memo.rule_keys.get(node_id, "missing") == rk
                and node_id in memo.contributions
                and not any(k in dirty for k in step.out_keys)
            )
            if reuse:
                contrib, row = memo.contributions[node_id], memo.stats[node_id]  # type: ignore[union-attr]
            else:
                if should_stop is not None and should_stop():
                    raise Cancelled("Cancelled.")
                gx, present, row, how = self._run_node(fwd.calls[node_id], rule, dys)
                contrib = [(k, g) for k, g, p in zip(step.in_keys, gx, present) if p]
                ran["recomputed"] += 1
                ran[how] += 1
                dirty.update(k for k, _ in contrib)
            contributions[node_id] = contrib
            stats[node_id] = row
            for k, g in contrib:
                grads[k] = g if k not in grads else grads[k] + g
        self._memo = _Memo(target_key, rule_keys, contributions, stats)
        inputs = [grads.get(k) for k in engine.exec.input_keys]
        return SweepResult(
            inputs, arrived, stats, ran["recomputed"], ran["compiled"], ran["lowered"], ran["eager"], idx
        )

    # ------------------------------------------------------------------------------------------- block kernels
    def segments(self) -> dict[int, Segment]:
        """The model's segments by their last step (``engine.backward.segments``)."""
        if self._segments is None:
            exec_ = self.engine.exec
            found = find_segments(exec_.steps, [self.engine.logits_key, *exec_.output_keys])
            self._segments = {s.last: s for s in found}
        return self._segments

    def _segment_key(self, segment: Segment, rules: dict[str, Any]) -> tuple:
        """Segments with equal keys share a kernel: the same steps (kernel keys: layer, shapes and rule) wired the
        same way."""
        node_rules = tuple(rule_key(rules.get(n)) for n in segment.node_ids)
        cached = (segment.last, node_rules)
        if cached not in self._segment_keys:
            calls = self._forward.calls  # type: ignore[union-attr]
            local: dict[Any, int] = {}
            parts: list[Any] = []
            for step in self.engine.exec.steps[segment.first : segment.last + 1]:
                wiring = tuple(local.setdefault(k, len(local)) for k in step.in_keys)
                wiring += tuple(local.setdefault(k, len(local)) for k in step.out_keys)
                node = None if step.kind == "alias" else self._kernel_key(calls[step.node_id], rules.get(step.node_id))
                parts.append((step.kind, wiring, node))
            if len(self._segment_keys) > 8 * len(self.segments()):  # a plan and the prepared presets: a few each
                self._segment_keys.clear()
            self._segment_keys[cached] = (tuple(parts), local[segment.out_key])
        return self._segment_keys[cached]

    def _run_segment(self, segment: Segment, rules: dict, memo: _Memo | None, state: tuple, should_stop: Any) -> bool:
        """Run ``segment``'s backward under ``rules`` as its compiled kernel when it is ready, its signal enters
        through its output cut only and something in it changed (else the node-by-node loop reuses the last sweep)."""
        grads, dirty, contributions, arrived, rule_keys, stats, ran = state
        ids = segment.node_ids
        if segment.out_key not in grads:
            return False
        if any(k in grads for k in segment.inner_keys):  # a seed inside (a neuron target)
            return False
        keys = {n: rule_key(rules.get(n)) for n in ids}
        changed = (
            memo is None
            or segment.out_key in dirty
            or any(memo.rule_keys.get(n, "missing") != keys[n] or n not in memo.contributions for n in ids)
        )
        key = self._segment_key(segment, rules) if changed else None
        kernel = self._segment_kernels.get(key) if key is not None else None
        if kernel is None:
            return False
        if should_stop is not None and should_stop():
            raise Cancelled("Cancelled.")
        steps, fwd = self.engine.exec.steps, self._forward
        args = segment_arguments(segment, steps, fwd.calls, fwd.values, self._weights)  # type: ignore[union-attr]
        got = _call_flat(kernel.compiled, [grads[segment.out_key], *args])
        out = unpack(kernel, segment, steps, got)
        for node_id in ids:
            rule_keys[node_id] = keys[node_id]
            contributions[node_id] = out.contributions[node_id]
            stats[node_id] = out.stats[node_id]
            if node_id in out.arrived:
                arrived[node_id] = out.arrived[node_id]
                ran["recomputed"] += 1
                ran["compiled"] += 1
            for k, g in out.contributions[node_id]:
                if k not in segment.inner_keys and k != segment.out_key:  # what leaves the segment
                    grads[k] = g if k not in grads else grads[k] + g
                    dirty.add(k)
        return True

    def _compile_segments(
        self, rules: dict[str, Any], should_stop: Callable[[], bool] | None, *, prepared: bool = False
    ) -> int:
        """Trace the block kernel of every segment under ``rules``, from the inputs on (an edit needs the segments
        below it), onto the pool's shelf for prepared presets or shown plans. Zeros as the signal: tracing needs
        shapes, not values."""
        n = 0
        fwd = self._forward
        steps = self.engine.exec.steps
        for segment in sorted(self.segments().values(), key=lambda s: s.first):
            key = self._segment_key(segment, rules)
            if key in self._segment_kernels or key in self._failed_segments:
                continue
            if should_stop is not None and should_stop():
                raise Cancelled("Cancelled.")
            node_vjp = lambda call: self._node_vjp(call, rules.get(call.step.node_id))  # noqa: E731
            fn, kernel = build_kernel(segment, steps, fwd.calls, node_vjp, should_stop)  # type: ignore[union-attr]
            args = segment_arguments(segment, steps, fwd.calls, fwd.values, self._weights)  # type: ignore[union-attr]
            dy = tf.zeros_like(fwd.values[segment.out_key])  # type: ignore[union-attr]
            try:
                kernel.compiled = tf.function(fn, autograph=False).get_concrete_function(dy, args)
                kernel.compiled(dy, args)  # the first call optimises the graph: not in an edit's time
            except Cancelled:
                raise
            except Exception:  # noqa: BLE001 - a node that does not trace: its segment runs node by node
                self._failed_segments.add(key)
                continue
            self._segment_kernels.put(key, kernel, prepared=prepared)
            n += 1
        return n

    def _seeds(self, target: Target, values: dict, class_idx: Any) -> tuple[dict[Any, Any], Any]:
        """The target's gradient with respect to the tensors it reads (the start of the backward pass)."""
        engine = self.engine
        candidates: dict[int, tuple[Any, Any]] = {}
        keys = [engine.logits_key, *engine.exec.output_keys]
        if target.kind in ("neuron", "channel"):
            node_id = target.node or engine.graph.output_ids[0]
            keys += list(engine.exec.node_out_keys.get(node_id, []))
        for k in keys:
            v = values[k]
            candidates.setdefault(id(v), (k, v))
        watched = [v for _, v in candidates.values()]
        node_values = {
            n: [values[k] for k in ks] for n, ks in engine.exec.node_out_keys.items() if all(k in values for k in ks)
        }
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            for v in watched:
                tape.watch(v)
            scalar, idx = engine._target_scalar(target, values, node_values, class_idx)
        got = tape.gradient(scalar, watched)
        seeds = {k: g for (k, _), g in zip(candidates.values(), got) if g is not None}
        return seeds, idx.numpy()

    # ------------------------------------------------------------------------------------------- warm-up
    def warm(
        self,
        rules: dict[str, Any],
        should_stop: Callable[[], bool] | None = None,
        *,
        nodes: bool = True,
        prepared: bool = False,
    ) -> int:
        """Compile the kernels the last input needs under ``rules`` (zeros as the signal: tracing needs shapes,
        not values): block kernels (kept as a ``prepared`` preset's or a shown plan's), then each node's own: with
        ``nodes``, every node's (an edit inside a block runs them), else only those of nodes outside the block
        kernels (none when there is no block kernel). Returns how many were compiled; stops between kernels, and
        between nodes of a trace, when ``should_stop()``."""
        if self._forward is None:
            return 0
        n = self._compile_segments(rules, should_stop, prepared=prepared)
        covered = set() if nodes else self._in_block_kernels(rules)
        if not nodes and not covered:  # no block kernel (a small model): per-node kernels would not pay for a pick
            return n
        for step in reversed(self.engine.exec.steps):
            if step.kind == "alias" or step.node_id in covered or not self._needs_kernel(step.node_id, rules):
                continue
            call = self._forward.calls[step.node_id]
            key, (_, compiled), ready = self._kernel(call, rules.get(step.node_id))
            if ready:
                continue
            if should_stop is not None and should_stop():
                raise Cancelled("Cancelled.")
            ys = [self._forward.values[k] for k in step.out_keys]
            args = (call.xs, ys, call.weights(), [tf.zeros_like(y) for y in ys])
            compiled(*args)
            # The key fixes every input spec, so the kernel has one concrete function; called directly it skips
            # tf.function's per-call signature matching (~1 ms a node: 0.2 s of a ResNet50 sweep).
            self._kernels[key] = (self._kernels[key][0], compiled.get_concrete_function(*args))
            self._mark_ready(key)
            n += 1
        tapes = self._forward.tapes
        if any(isinstance(t, _Recorded) for t in tapes.values()) and self.pending_kernels({}) == 0:
            # every true-gradient kernel is compiled: the recorded VJPs hold memory only (lowered ones hold none)
            self._forward.tapes = {n: t for n, t in tapes.items() if isinstance(t, _LoweredVJP)}
        return n

    def _in_block_kernels(self, rules: dict[str, Any]) -> set[str]:
        """The nodes whose segment has a compiled block kernel under ``rules``."""
        return {
            node_id
            for segment in self.segments().values()
            if self._segment_key(segment, rules) in self._segment_kernels
            for node_id in segment.node_ids
        }

    def pending_kernels(self, rules: dict[str, Any]) -> int:
        """How many of the last input's nodes still run eagerly under ``rules``."""
        if self._forward is None:
            return 0
        return sum(
            self._kernel_key(self._forward.calls[s.node_id], rules.get(s.node_id)) not in self._ready
            for s in self.engine.exec.steps
            if s.kind != "alias" and self._needs_kernel(s.node_id, rules)
        )

    def _needs_kernel(self, node_id: str, rules: dict[str, Any]) -> bool:
        """Whether the node runs through a kernel under ``rules``: not for its true gradient when it is lowered."""
        return rules.get(node_id) is not None or not isinstance(self._forward.tapes.get(node_id), _LoweredVJP)
