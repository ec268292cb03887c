"""Block-sized kernels for the live path: the true backward of a run of nodes as one compiled function.

A live sweep that runs every node on its own pays TensorFlow's eager cost per op: measured on ResNet50 224x224
batch 1 (2-core CPU), a sweep of its 176 nodes with raw (lowered) ops took 190-240 ms against 75-85 ms for the
backward half of a compiled plain gradient, and a one-node edit near the output recomputes 170 of them. The
true gradient of a node does not depend on the plan, so whole runs of nodes without rules can be compiled once
per model and reused by every edit that leaves them alone.

A *segment* is a run of steps of which only one tensor is read after it, so the backward signal enters it
through that tensor alone (ResNet's residual blocks, a transformer's layers, any stretch of a chain). Its kernel
takes the signal there and the forward values of its nodes and returns what the node-by-node sweep would have
computed: each node's signal, its contributions to its inputs and its statistics row (``stats_rows``,
in-graph). Kernels are shared by segments with equal layer configurations, shapes and rules (a stage's identical
blocks), with the weights passed in. A block under a preset's rules gets a kernel of its own (MWP's W+
convolutions and divisions, fused by the graph optimiser, where eagerly each is an op call and a buffer).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gradscope.backend import tf
from gradscope.core.errors import Cancelled
from gradscope.engine.backward.keras_graph import Step
from gradscope.engine.backward.node_call import NodeCall
from gradscope.engine.backward.stats import stats_rows

MIN_STEPS = 6  # nodes at least: a kernel call costs ~0.3 ms, a node run eagerly ~1 ms
MAX_STEPS = 48  # nodes at most: a longer trace would take seconds


@dataclass(frozen=True)
class Segment:
    """Steps ``first..last`` (indices into the exec steps) of which one tensor, ``out_key``, is read after them:
    the signal enters through it alone. Tensors made before the segment may be read inside (its input, a mask
    every block reads): the kernel returns its contributions to them."""

    first: int
    last: int
    out_key: Any
    inner_keys: frozenset  # keys made inside, ``out_key`` excepted: no signal may enter there from outside
    node_ids: tuple[str, ...]


def find_segments(steps: Sequence[Step], final_keys: Sequence[Any]) -> list[Segment]:
    """Consecutive segments, greedily: from a start, the first end at which exactly one of the tensors made so
    far is still read later and the run holds ``MIN_STEPS`` nodes; a start with no such end within
    ``MAX_STEPS`` nodes is left to the node-by-node sweep. ``final_keys`` (outputs, logits) are read at the end."""
    n = len(steps)
    last_use: dict[Any, int] = {}
    for i, step in enumerate(steps):
        for k in step.in_keys:
            last_use[k] = i
    for k in final_keys:
        last_use[k] = n
    segments: list[Segment] = []
    start = 0
    while start < n:
        made: list[Any] = []
        count = 0
        end = None
        for i in range(start, n):
            made += steps[i].out_keys
            count += steps[i].kind != "alias"
            if count > MAX_STEPS:
                break
            escaping = {k for k in made if last_use.get(k, -1) > i}
            if count >= MIN_STEPS and len(escaping) == 1:
                end, out_key = i, escaping.pop()
                break
        if end is None:
            start += 1
            continue
        part = steps[start : end + 1]
        inner = frozenset(k for step in part for k in step.out_keys) - {out_key}
        segments.append(Segment(start, end, out_key, inner, tuple(s.node_id for s in part if s.kind != "alias")))
        start = end + 1
    return segments


@dataclass
class SegmentKernel:
    """One traced kernel, shared by every segment of its key: ``compiled(dy, *segment_arguments(...))`` returns
    flat outputs that ``unpack`` reads through ``layout``."""

    compiled: Any = None  # the concrete function once traced
    # per node, in reverse step order: where its contributions and signals sit among the outputs, and its stats
    # row (None: no signal arrives); filled in by the trace
    layout: list[tuple[list[int], int | None]] = field(default_factory=list)


class KernelPool:
    """Traced block kernels by key, least recently used out first, on two shelves: the shown plans' (an edit
    traces one for its edited block, seldom used again) and the prepared presets' (kept apart, so that many edits
    do not evict them and the idle step does not trace them again after every edit)."""

    def __init__(self, shown: int, prepared: int) -> None:
        self._limits = {False: shown, True: prepared}
        self._shelves: dict[bool, OrderedDict[tuple, SegmentKernel]] = {False: OrderedDict(), True: OrderedDict()}

    def get(self, key: tuple) -> SegmentKernel | None:
        """The kernel of ``key`` (now the most recently used on its shelf), or None."""
        for shelf in self._shelves.values():
            if key in shelf:
                shelf.move_to_end(key)
                return shelf[key]
        return None

    def put(self, key: tuple, kernel: SegmentKernel, *, prepared: bool) -> None:
        shelf = self._shelves[prepared]
        shelf[key] = kernel
        while len(shelf) > self._limits[prepared]:
            shelf.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return any(key in shelf for shelf in self._shelves.values())

    def __iter__(self) -> Iterator[tuple]:
        return (key for shelf in self._shelves.values() for key in shelf)

    def __len__(self) -> int:
        return sum(len(shelf) for shelf in self._shelves.values())


@dataclass
class SegmentOutput:
    arrived: dict[str, list[Any]]  # node id -> signal at each of its outputs
    contributions: dict[str, list[tuple[Any, Any]]]
    stats: dict[str, Any]  # node id -> stats row (numpy), None where no signal arrives


def segment_arguments(
    segment: Segment, steps: Sequence[Step], calls: dict[str, NodeCall], values: dict, weights: dict[str, list]
) -> list:
    """The forward tensors a segment's kernel reads, flat: per node its inputs, outputs and weights. Weights
    are read once into ``weights`` (node id -> values, kept until the weights change): a kernel takes tensors,
    not variables, and reading ResNet50's 320 variables eagerly costs ~30 ms."""
    flat: list[Any] = []
    for step in steps[segment.first : segment.last + 1]:
        if step.kind == "alias":
            continue
        call = calls[step.node_id]
        if step.node_id not in weights:
            weights[step.node_id] = [tf.convert_to_tensor(w) for w in call.weights()]
        flat += call.xs + [values[k] for k in step.out_keys] + weights[step.node_id]
    return flat


def build_kernel(
    segment: Segment,
    steps: Sequence[Step],
    calls: dict[str, NodeCall],
    node_vjp: Callable[[NodeCall], Callable[[list, list, list, list], list]],
    should_stop: Callable[[], bool] | None = None,
) -> tuple[Callable[..., Any], SegmentKernel]:
    """The segment's backward as ``fn(dy, flat)`` (flat: ``segment_arguments``) and its output layout, filled
    in when ``fn`` is traced. ``node_vjp(call)`` gives a node's VJP ``(xs, ys, ws, dys) -> dxs`` (its true one,
    or its rule's). A trace stops between nodes when ``should_stop()`` (raises ``Cancelled``): a click waits
    for one node's trace, not a block's."""
    part = list(steps[segment.first : segment.last + 1])
    templates = {s.node_id: calls[s.node_id].template() for s in part if s.kind != "alias"}
    vjps = {nid: node_vjp(call) for nid, call in templates.items()}
    kernel = SegmentKernel()

    def fn(dy: Any, flat: list) -> list:
        flat = list(flat)
        grads: dict[Any, Any] = {segment.out_key: dy}
        outputs: list[Any] = []
        signals: list[Any] = []
        layout: list[tuple[list[int], int | None]] = []
        by_node: dict[str, tuple[list, list, list]] = {}
        offset = 0
        for step in part:
            if step.kind == "alias":
                continue
            call = templates[step.node_id]
            sizes = (len(call.positions), len(step.out_keys), len(call.variables))
            cut = [offset, offset + sizes[0], offset + sizes[0] + sizes[1], offset + sum(sizes)]
            by_node[step.node_id] = (flat[cut[0] : cut[1]], flat[cut[1] : cut[2]], flat[cut[2] : cut[3]])
            offset = cut[3]
        for step in reversed(part):
            if step.kind == "alias":
                for src, dst in zip(step.in_keys, step.out_keys):
                    g = grads.pop(dst, None)
                    if g is not None:
                        grads[src] = g if src not in grads else grads[src] + g
                continue
            if should_stop is not None and should_stop():
                raise Cancelled("Cancelled.")
            xs, ys, ws = by_node[step.node_id]
            dys = [grads.get(k) for k in step.out_keys]
            if all(d is None for d in dys):
                layout.append(([], None))
                continue
            dys = [tf.zeros_like(y) if d is None else d for d, y in zip(dys, ys)]
            gx = vjps[step.node_id](list(xs), list(ys), list(ws), dys)
            at = []
            for k, g in zip(step.in_keys, gx):
                if g is None:
                    at.append(-1)
                    continue
                at.append(len(outputs))
                outputs.append(g)
                grads[k] = g if k not in grads else grads[k] + g
            at += [len(outputs) + j for j in range(len(dys))]
            outputs += dys
            layout.append((at, len(signals)))
            signals.append(dys[0])
        kernel.layout = layout
        return [*outputs, stats_rows(signals)]

    return fn, kernel


def unpack(kernel: SegmentKernel, segment: Segment, steps: Sequence[Step], got: Sequence[Any]) -> SegmentOutput:
    """The kernel's flat outputs as per-node signals, contributions and statistics rows."""
    rows = got[-1].numpy()
    out = SegmentOutput({}, {}, {})
    # the layout is in reverse step order (a shared kernel was traced on another segment: its positions hold)
    nodes = [s for s in reversed(steps[segment.first : segment.last + 1]) if s.kind != "alias"]
    for step, (at, row) in zip(nodes, kernel.layout):
        node_id = step.node_id
        if row is None:
            out.stats[node_id] = None
            out.contributions[node_id] = []
            continue
        n_in = len(step.in_keys)
        out.contributions[node_id] = [(k, got[i]) for k, i in zip(step.in_keys, at[:n_in]) if i >= 0]
        out.arrived[node_id] = [got[i] for i in at[n_in:]]
        out.stats[node_id] = rows[row]
    return out
