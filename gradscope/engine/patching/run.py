"""``patch_effects``: the patching effects of chosen components over every block and unit, by one method, with the
estimate's agreement with the exact effects when asked."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradscope.core.errors import GraphError, InputError
from gradscope.core.patching import METHODS, PatchResult, agreement
from gradscope.core.targets import Target
from gradscope.engine.patching.attention_parts import PROBS, ROLES, hooked, qk_fixed
from gradscope.engine.patching.attribution import Signals, captured_forward, first_order, graddrop
from gradscope.engine.patching.components import blocks, component_nodes
from gradscope.engine.patching.exact import run_patches
from gradscope.engine.patching.metric import Metric
from gradscope.engine.patching.units import Units


def patch_effects(
    engine: Any,
    clean: Any,
    corrupt: Any,
    target: Target | None = None,
    *,
    metric: str = "logit",
    components: Sequence[str] = ("resid",),
    nodes: Sequence[str] | None = None,
    method: str = "atp",
    grid: int = 7,
    compare: bool = False,
    labels: Sequence[str] | None = None,
    decode: Callable[[Any], list[str]] | None = None,
    only: Sequence[tuple[str, int]] | None = None,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> PatchResult:
    """Effects on ``metric`` of patching each component (``components`` of every transformer block, or the
    ``nodes`` named) at each unit (token position; a ``grid`` x ``grid`` cell of an image) with its value on
    ``corrupt``, by ``method`` ("exact", "atp", "atp_star"). ``compare``: also the exact effects, and the
    estimate's agreement with them. ``labels``: the units' names (the tokens); ``decode(ids)``: a token's text,
    for the metric's description; ``only``: the (component, block) rows whose exact effects are computed (the
    others NaN: a Ray worker's share of a grid). ``progress(done, total)`` after each batch; ``should_stop()``
    cancels."""
    if method not in METHODS:
        raise InputError(f"The patching method is one of {', '.join(METHODS)}; got {method!r}.")
    t0 = time.perf_counter()
    clean_xs, corrupt_xs = _pair(engine, clean, corrupt)
    by_component = {"nodes": list(nodes)} if nodes else component_nodes(engine.graph, tuple(components))
    attention = sorted({n for c, names in by_component.items() if c in ROLES for n in names})
    measured = method == "exact" or compare
    qk_fix = method == "atp_star" and any(c in ("q", "k") for c in by_component)  # re-runs attention layers
    target = target or Target()
    if measured or qk_fix:
        pair = _run_pair(engine, clean_xs, corrupt_xs, by_component, attention, target, metric)
    else:
        pair = _estimate_pair(engine, clean_xs, corrupt_xs, by_component, target, metric, method == "atp_star")
    m = pair.metric
    base, changed = (float(m.of(z)[0]) for z in pair.logits)
    run = _Run(engine, clean_xs, pair.values, m, base, pair.clean, pair.corrupt, pair.inside)
    run.passes = pair.passes
    run.units = _units(engine, clean_xs, by_component, grid, labels)
    for part, value in run.clean.items():
        run.units.check(tuple(value.shape), part if isinstance(part, str) else f"{part[0]} ({part[1]})")
    cells = (len(only) if only is not None else sum(len(n) for n in by_component.values())) * run.units.count
    total = cells if measured else 0
    if method != "exact":
        total += 1 + (len(blocks(engine.graph)) + (cells if attention else 0) if method == "atp_star" else 0)
    run.progress, run.total, run.should_stop = progress, total, should_stop

    def exact_row(component: str, block: int, node: str) -> np.ndarray:
        if only is not None and (component, block) not in only:
            return np.full(run.units.count, np.nan)
        return run.exact(_key(component, node))

    exact = {}
    if measured:
        exact = {c: np.stack([exact_row(c, b, n) for b, n in enumerate(names)]) for c, names in by_component.items()}
    effects = exact if method == "exact" else run.estimates(by_component, star=method == "atp_star")
    signed = method != "atp_star"
    agreements = {c: agreement(effects[c], exact[c], signed=signed) for c in effects} if compare and exact else {}
    return PatchResult(
        method=method,
        metric=m.describe(decode),
        clean_value=base,
        corrupt_value=changed,
        by_component=effects,
        nodes={c: list(n) for c, n in by_component.items()},
        units=list(run.units.labels),
        signed=signed,
        grid=run.units.grid,
        agreement=agreements,
        exact=exact if method != "exact" else {},
        seconds=time.perf_counter() - t0,
        sidecar={
            "metric_kind": metric,
            "kind": "class" if m.position is None else "token",
            "index": m.index,
            "contrast": m.contrast,
            "position": m.position,
        },
    )


@dataclass
class _Pair:
    """The clean and corrupted runs as patching needs them: the metric fixed on the clean one, both logits, each
    component's values on both, and what the patched runs or the estimates reuse."""

    metric: Metric
    logits: tuple[Any, Any]
    clean: dict[Any, Any]
    corrupt: dict[Any, Any]
    values: dict = field(default_factory=dict)  # every value of the clean run by key (exact patches resume from it)
    inside: dict = field(default_factory=dict)  # the clean run's q, k, v and attention probabilities
    passes: list | None = None  # the clean gradient passes an estimate already made


def _run_pair(engine, clean_xs, corrupt_xs, by_component, attention, target, metric) -> _Pair:
    """Both runs eagerly, every value kept: exact patches resume from the clean one, the QK fix re-runs its
    attention layers."""
    inside_clean: dict = {}
    inside_corrupt: dict = {}
    with hooked(engine, attention, record=inside_clean):
        clean_values, clean_nodes = engine._run(clean_xs, {})
    with hooked(engine, attention, record=inside_corrupt):
        corrupt_values, corrupt_nodes = engine._run(corrupt_xs, {})
    return _Pair(
        Metric.on_clean(engine, target, metric, clean_values),
        (clean_values[engine.logits_key], corrupt_values[engine.logits_key]),
        _parts(by_component, clean_nodes, inside_clean),
        _parts(by_component, corrupt_nodes, inside_corrupt),
        clean_values,
        inside_clean,
    )


def _estimate_pair(engine, clean_xs, corrupt_xs, by_component, target, metric, star: bool) -> _Pair:
    """What an estimate is made of, and nothing more: the clean gradient pass (AtP*: one per held-back block), which
    gives the clean values and logits too, and one compiled forward on the corrupted input."""
    keys = [_key(c, n) for c, names in by_component.items() for n in names]
    node_keys, part_keys = [k for k in keys if isinstance(k, str)], [k for k in keys if not isinstance(k, str)]
    m = Metric.for_target(engine, target, metric, clean_xs)  # its token: the clean pass's most likely, unless given
    passes = _clean_passes(engine, m, clean_xs, keys, star)
    corrupt_logits, corrupt_values = captured_forward(engine, node_keys, part_keys)(corrupt_xs)
    return _Pair(
        m.resolved(passes[0].logits),
        (passes[0].logits, corrupt_logits),
        passes[0].values,
        dict(zip(node_keys + part_keys, corrupt_values)),
        passes=passes,
    )


def _clean_passes(engine: Any, metric: Metric, xs: list, keys: list, star: bool, extra: Sequence = ()) -> list:
    """The clean gradient passes an estimate reads, at ``keys`` (and the ``extra`` parts): one, or AtP*'s one per
    transformer block held back."""
    found = blocks(engine.graph) if star else []
    if star and not found:
        raise GraphError("AtP* holds back each transformer block in turn (GradDrop); this model has none: use atp.")
    nodes, parts = [k for k in keys if isinstance(k, str)], [k for k in keys if not isinstance(k, str)]
    signals = Signals(engine, metric, nodes, [b.branches for b in found], parts + list(extra))
    return [signals(xs, held_back) for held_back in (range(len(found)) if star else [None])]


def _key(component: str, node: str) -> Any:
    """What a component names in a block: a node's output, or ``(attention node, role)`` for q, k and v."""
    return (node, component) if component in ROLES else node


def _parts(by_component: dict, node_values: dict, inside: dict) -> dict:
    return {
        _key(c, n): inside[(n, c)] if c in ROLES else node_values[n][0]
        for c, names in by_component.items()
        for n in names
    }


class _Run:
    """One clean / corrupted pair: the values of both runs, the metric, and the work done so far."""

    def __init__(self, engine, xs, values, metric, base, clean, corrupt, inside) -> None:
        self.engine, self.xs, self.values, self.metric, self.base = engine, xs, values, metric, base
        self.clean, self.corrupt, self.inside = clean, corrupt, inside
        self.units: Units | None = None
        self.passes: list | None = None  # the clean passes already made (an estimate without exact values)
        self.progress: Callable | None = None
        self.should_stop: Callable | None = None
        self.total, self.done = 0, 0

    def advance(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)

    def exact(self, part: Any) -> np.ndarray:
        node, role = (part, None) if isinstance(part, str) else part
        clean, corrupt = self.clean[part], self.corrupt[part]
        return run_patches(self.engine, self.values, node, self.units, self.metric, clean, corrupt, role=role,
                           on_batch=self.advance, should_stop=self.should_stop)  # fmt: skip

    def estimates(self, by_component: dict, *, star: bool) -> dict[str, np.ndarray]:
        """AtP of every (component, block, unit); AtP*: GradDrop's combination, q and k through the QK fix. The
        clean passes are the ones ``patch_effects`` made when it had them (``passes``)."""
        engine, units = self.engine, self.units
        keys = [_key(c, n) for c, names in by_component.items() for n in names]
        fixed = [k for k in keys if star and not isinstance(k, str) and k[1] in ("q", "k")]
        passes = self.passes
        if passes is None:  # the QK fix reads the attention probabilities' gradients too
            passes = _clean_passes(engine, self.metric, self.xs, keys, star, [(k[0], PROBS) for k in fixed])
        self.advance(len(passes))
        per_pass: dict[Any, list[np.ndarray]] = {}
        for k in keys:
            if k in fixed:
                per_pass[k] = qk_fixed(engine, self.values, k[0], k[1], self.corrupt[k], units,
                                       self.inside[(k[0], PROBS)], [g.grads[(k[0], PROBS)] for g in passes],
                                       on_batch=self.advance, should_stop=self.should_stop)  # fmt: skip
            else:
                diff = self.corrupt[k] - self.clean[k]
                per_pass[k] = [units.totals(first_order(diff, g.grads[k])) for g in passes]
        self.advance(1)
        combine = graddrop if star else (lambda estimates: estimates[0])
        return {c: np.stack([combine(per_pass[_key(c, n)]) for n in names]) for c, names in by_component.items()}


def _pair(engine: Any, clean: Any, corrupt: Any) -> tuple[list, list]:
    clean_xs, corrupt_xs = engine._as_inputs(clean), engine._as_inputs(corrupt)
    for a, b, name in zip(clean_xs, corrupt_xs, engine.graph.input_ids):
        if int(a.shape[0]) != 1 or int(b.shape[0]) != 1:
            raise InputError("Patching compares one clean and one corrupted input (a batch of one each).")
        if tuple(a.shape) != tuple(b.shape) and engine.graph.token_input is not None:
            raise InputError(
                f"The clean input has {a.shape[1]} tokens, the corrupted one {b.shape[1]}: a patch puts one's value in "
                "the other's place, position by position, so they need as many tokens (choose words that split alike)."
            )
        if tuple(a.shape) != tuple(b.shape):
            raise InputError(
                f"The clean and corrupted inputs differ in shape at {name!r} ({tuple(a.shape)} vs {tuple(b.shape)}): "
                "a patch puts one's value in the other's place, so they must align (as many tokens, the same size)."
            )
    return clean_xs, corrupt_xs


def _units(engine: Any, xs: list, by_component: dict, grid: int, labels: Sequence[str] | None) -> Units:
    graph = engine.graph
    if graph.token_input is not None:
        length = int(xs[graph.input_ids.index(graph.token_input)].shape[1])
        return Units.positions(length, tuple(labels) if labels else None)
    first = next(iter(by_component.values()))[0]
    shape = graph.node(first).output_shape
    if len(shape) == 4:
        if not 1 <= grid <= 64:
            raise InputError(f"The grid is 1 to 64 cells a side; got {grid}.")
        return Units.cells(grid, grid)
    if len(shape) == 3 and shape[1] is not None:
        return Units.positions(int(shape[1]), tuple(labels) if labels else None)
    raise GraphError(f"Node {first!r} has shape {shape}: patching needs token positions or an image's grid cells.")
