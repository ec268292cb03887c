"""Sanity checks a researcher runs on a rule or a plan before trusting its maps.

- ``conservation``: the relevance summed at each node's output against the seed's (LRP's layer-wise
  conservation, Bach et al. 2015): a node whose relevance differs from the node feeding it (one producer, one
  consumer) by more than ``tolerance`` is flagged. Under LRP and MWP rules the signal *is* the relevance
  (RULES_SPEC §1: ``g_in = x ⊙ VJP(W, g ⊘ z)``, seed one-hot); under gradient-like plans the relevance is
  ``value * signal`` (gradient x input, conserved by bias-free ReLU nets).
- ``model_randomisation``: the cascading test of Adebayo et al. 2018 ("Sanity checks for saliency maps"):
  re-initialise the weights layer by layer from the output down and report the Spearman rank correlation of
  the |map| with the original one. A method that explains the model should decorrelate quickly; one that does
  not (guided backprop is the classic case) shows the input's edges whatever the weights.
- ``finite_differences``: the signal at a node equals the true gradient only where no rule changes it, i.e.
  at the model input without rules and at every node above all ruled nodes. These signals are compared with
  central finite differences of the forward pass along seeded random directions.

Weights are changed in place for the randomisation (the compiled passes read variables when they run, so no
retrace is needed) and always restored, and the live sweep's cached forward values are dropped afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gradscope.backend import tf
from gradscope.core.display import RichDisplay
from gradscope.core.errors import TargetError
from gradscope.core.targets import Target
from gradscope.rules.base import carries_relevance
from gradscope.rules.plan import Plan

Progress = Callable[[str], None]  # a message per step; may raise Cancelled


@dataclass
class ConservationRow:
    node: str
    relevance: float  # sum over the batch of value * signal at the node's output
    ratio_to_target: float  # relevance / the seed's (the target node's)
    ratio_to_producer: float | None  # relevance of the one node feeding it / this node's (None: not one-to-one)
    flagged: bool


@dataclass
class RandomisationRow:
    layer: str  # the last layer re-initialised (all layers above it are re-initialised too)
    rank_correlation: float  # Spearman, |map| of the randomised model vs the original


@dataclass
class FiniteDifferenceRow:
    node: str  # "<input>" for the model input
    relative_error: float  # |g.v - fd| / max(|fd|, |g.v|, tiny), worst over the directions
    flagged: bool


@dataclass
class SanityReport(RichDisplay):
    _html_maker = "gradscope.app.display.reports:sanity_html"  # in a notebook (gradscope.core.display)

    method: str
    target_value: float
    relevance: str  # "signal" (LRP/MWP rules) or "value x signal" (gradient-like plans)
    conservation: list[ConservationRow]
    randomisation: list[RandomisationRow]
    finite_differences: list[FiniteDifferenceRow]
    tolerance: float
    checked_finite_differences: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_text(self) -> str:
        lines = [f"Sanity checks for {self.method} (target value {self.target_value:.4g})"]
        if self.conservation:
            flagged = [r for r in self.conservation if r.flagged]
            lines.append(
                f"\nConservation (relevance = {self.relevance}; tolerance {self.tolerance:.0%}): "
                + ("holds at every one-to-one node" if not flagged else f"{len(flagged)} node(s) break it")
            )
            for r in self.conservation:
                producer = "" if r.ratio_to_producer is None else f"  producer/this {r.ratio_to_producer:8.4f}"
                mark = "  <- not conserved" if r.flagged else ""
                lines.append(f"  {r.node:<28} R {r.relevance:12.5g}  R/target {r.ratio_to_target:8.4f}{producer}{mark}")
        if self.randomisation:
            lines.append("\nModel randomisation (Adebayo et al. 2018), weights re-initialised from the output down:")
            for r in self.randomisation:
                lines.append(
                    f"  down to {r.layer:<28} rank correlation with the original map {r.rank_correlation:+.3f}"
                )
            last = self.randomisation[-1].rank_correlation
            lines.append(
                "  the map no longer depends on the weights: it does not explain the model"
                if last > 0.5
                else "  the map changes with the weights, as an explanation of the model should"
            )
        if not self.finite_differences and self.checked_finite_differences:
            lines.append("\nFinite differences: every node lies below a rule (no path is untouched); nothing to check.")
        if self.finite_differences:
            flagged = [r for r in self.finite_differences if r.flagged]
            lines.append(
                f"\nFinite differences on paths no rule changes (tolerance {self.tolerance:.0%}): "
                + ("all agree" if not flagged else f"{len(flagged)} disagree")
            )
            for r in self.finite_differences:
                lines.append(
                    f"  {r.node:<28} relative error {r.relative_error:.2e}{'  <- differs' if r.flagged else ''}"
                )
        return "\n".join(lines)


def sanity_checks(
    engine: Any,
    x: Any,
    target: Target,
    plan: Plan | None = None,
    *,
    method: str = "",
    checks: tuple[str, ...] = ("conservation", "randomisation", "finite_differences"),
    tolerance: float = 0.05,
    seed: int = 0,
    progress: Progress | None = None,
) -> SanityReport:
    """Run the chosen checks for ``plan`` (``method`` names it in the report) on one input batch ``x``."""
    plan = plan or Plan()
    if target.kind == "class" and engine.is_language_model():  # a language model's class is its next token
        target = target.as_token()
    target = _fixed_class(engine, x, target)
    report = progress or (lambda message: None)
    base = engine.backward(x, target, plan, capture="all", mode="compiled")
    if target.kind == "token" and target.index is None:  # the randomised models explain the same token
        target = dataclasses.replace(target, index=int(np.asarray(base.target_indices).reshape(-1)[0]))
    target_value = _target_value(engine, base, target, x)
    as_signal = carries_relevance(base.rules.values())
    conservation = _conservation(engine, base, as_signal, tolerance) if "conservation" in checks else []
    randomisation = []
    if "randomisation" in checks:
        randomisation = model_randomisation(engine, x, target, plan, seed=seed, progress=report, reference=base)
    fd = []
    if "finite_differences" in checks:
        report("Finite differences...")
        fd = finite_differences(engine, x, target, plan, seed=seed, tolerance=tolerance, result=base)
    relevance = "signal" if as_signal else "value x signal"
    name = method or plan.name or "plan"
    checked = "finite_differences" in checks
    return SanityReport(name, target_value, relevance, conservation, randomisation, fd, tolerance, checked)


def _fixed_class(engine: Any, x: Any, target: Target) -> Target:
    if target.kind == "class" and target.index is None:
        logits = np.asarray(engine.predict(x))
        if logits.ndim == 2 and logits.shape[0] == 1:
            return Target(index=int(np.argmax(logits[0])))
    return target


def _target_value(engine: Any, result: Any, target: Target, x: Any) -> float:
    if target.kind == "token":  # the logit of the token at its position, less the contrast's
        from gradscope.engine.backward.token_targets import first_position

        logits = np.asarray(result.logits, np.float64)[0, first_position(engine, target, engine.checked_inputs(x))]
        return float(logits[target.index] - (logits[target.contrast] if target.contrast is not None else 0.0))
    if target.kind == "class":
        logits = np.asarray(result.logits, np.float64)
        return float(np.take_along_axis(logits, np.asarray(result.target_indices).reshape(-1, 1), 1).sum())
    if target.kind == "loss":
        raise TargetError("Sanity checks explain a class, neuron or channel, not a training loss.")
    node = target.node or engine.graph.output_ids[0]
    value = np.asarray(result.node_values[node], np.float64)
    return float(
        value[(slice(None), *target.neuron)].sum() if target.kind == "neuron" else value[..., target.channel].sum()
    )


# ----------------------------------------------------------------------------------------------- conservation
def _conservation(engine: Any, result: Any, as_signal: bool, tolerance: float) -> list[ConservationRow]:
    graph = engine.graph
    consumers: dict[str, list[str]] = {}
    for node in graph.nodes:
        for producer in node.inputs:
            consumers.setdefault(producer, []).append(node.id)
    relevance: dict[str, float] = {}
    for node in graph.nodes:
        if node.is_input:
            signal, value = (
                result.input_grads[graph.input_ids.index(node.id)],
                result.inputs[graph.input_ids.index(node.id)],
            )
        elif node.id in result.node_grads:
            signal, value = result.node_grads[node.id], result.node_values[node.id]
        else:
            continue
        signal = np.asarray(signal, np.float64)
        relevance[node.id] = float(np.sum(signal if as_signal else np.asarray(value, np.float64) * signal))
    top = graph.node(graph.output_ids[0])
    seed_node = top.inputs[0] if engine.softmax_stripped else top.id  # the seed is on the logits
    above = {top.id} if engine.softmax_stripped else set()
    scale = abs(relevance.get(seed_node, 0.0)) or 1.0
    rows = []
    for node in graph.nodes:
        if node.id not in relevance or node.id in above:
            continue
        r = relevance[node.id]
        one_to_one = len(node.inputs) == 1 and consumers.get(node.inputs[0]) == [node.id]
        ratio = None
        flagged = False
        if one_to_one and node.inputs[0] in relevance:
            r_in = relevance[node.inputs[0]]
            ratio = r_in / r if r else (1.0 if not r_in else float("inf"))
            flagged = abs(r_in - r) > tolerance * max(abs(r), 1e-6 * scale)
        rows.append(ConservationRow(node.id, r, r / scale, ratio, flagged))
    return rows


# ----------------------------------------------------------------------------------------------- randomisation
def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two arrays (ranks by sorting; ties are rare for real-valued maps)."""
    ra = np.empty(a.size)
    rb = np.empty(b.size)
    ra[np.argsort(a.ravel(), kind="stable")] = np.arange(a.size)
    rb[np.argsort(b.ravel(), kind="stable")] = np.arange(b.size)
    ra -= ra.mean()
    rb -= rb.mean()
    denominator = np.sqrt((ra**2).sum() * (rb**2).sum())
    return float((ra * rb).sum() / denominator) if denominator else 0.0


def _map_node(engine: Any) -> str | None:
    """Where the map is read: the model input, or for token ids (no gradient reaches an integer) the embedding."""
    token = engine.graph.token_input
    return engine.graph.embedding_of(token).id if token is not None else None


def _abs_map(result: Any, node: str | None) -> np.ndarray:
    if node is not None:  # one value per token
        return np.abs(np.asarray(result.node_grads[node], np.float64)).sum(axis=-1)
    g = np.abs(np.asarray(result.input_grads[0], np.float64))
    return g.max(axis=-1) if g.ndim >= 3 else g


def model_randomisation(
    engine: Any,
    x: Any,
    target: Target,
    plan: Plan,
    *,
    seed: int = 0,
    progress: Progress | None = None,
    reference: Any = None,
) -> list[RandomisationRow]:
    """Cascading randomisation: for each layer with weights, from the output down, re-initialise it (and keep
    the ones above re-initialised) with Gaussian values of the same standard deviation as its trained weights,
    and correlate the |map| with the original. The weights are restored afterwards, whatever happens."""
    node = _map_node(engine)
    capture = [node] if node is not None else ()
    reference = reference or engine.backward(x, target, plan, capture=capture, mode="compiled", stats=False)
    original = _abs_map(reference, node)
    layers = _weighted_layers(engine)
    saved = [[v.numpy() for v in variables] for _, variables in layers]
    rng = np.random.default_rng(seed)
    rows = []
    try:
        for i, (node_id, variables) in enumerate(reversed(layers)):
            if progress is not None:
                progress(f"Randomising {node_id} ({i + 1} of {len(layers)})...")
            for v in variables:
                w = v.numpy()
                std = float(np.std(w)) or 0.05
                v.assign(rng.normal(0.0, std, w.shape).astype(w.dtype))
            randomised = engine.backward(x, target, plan, capture=capture, mode="compiled", stats=False)
            rows.append(RandomisationRow(node_id, spearman(original, _abs_map(randomised, node))))
    finally:
        for (_, variables), values in zip(layers, saved):
            for v, value in zip(variables, values):
                v.assign(value)
        engine.live.forget()  # forward values cached during the check belong to the randomised weights
    return rows


def _weighted_layers(engine: Any) -> list[tuple[str, list[Any]]]:
    """(node id, its trainable float weights) in graph order, each layer once (a shared layer at its first node)."""
    seen: set[int] = set()
    out = []
    for node in engine.graph.nodes:
        op = engine.exec.operations.get(node.id)
        if op is None or id(op) in seen or node.fused_with is not None:
            continue
        # learnable weights only, as Adebayo et al.: a BatchNorm's moving variance must stay positive
        variables = [v for v in getattr(op, "trainable_weights", []) or [] if "float" in str(v.dtype)]
        if variables:
            seen.add(id(op))
            out.append((node.id, variables))
    return out


# ----------------------------------------------------------------------------------------------- finite differences
def finite_differences(
    engine: Any,
    x: Any,
    target: Target,
    plan: Plan,
    *,
    directions: int = 3,
    seed: int = 0,
    tolerance: float = 0.05,
    result: Any = None,
    max_nodes: int = 6,
) -> list[FiniteDifferenceRow]:
    """Compare the signal with central finite differences at the nodes no rule can change (see the module
    docstring): the model input when the plan has no rules, and up to ``max_nodes`` nodes above every rule."""
    if target.kind == "loss":
        raise TargetError("Finite differences here check class, neuron and channel targets.")
    result = result or engine.backward(x, target, plan, capture="all", mode="compiled")
    ruled = set(result.rules)
    below = _nodes_below(engine.graph, ruled)  # ruled nodes and everything feeding them
    nodes = [n.id for n in engine.graph.nodes if not n.is_input and n.id not in below and n.id in result.node_grads]
    nodes = [n for n in nodes if not engine.graph.node(n).is_output][-max_nodes:]
    checks: list[tuple[str, Any, np.ndarray]] = []
    if not ruled and not engine.graph.is_integer_input(engine.graph.input_ids[0]):  # token ids have no derivative
        checks.append(("<input>", None, np.asarray(result.input_grads[0], np.float64)))
    checks += [(n, n, np.asarray(result.node_grads[n], np.float64)) for n in nodes]
    xs = engine._as_inputs(x)
    class_idx = tf.constant(np.asarray(result.target_indices, np.int32))
    rng = np.random.default_rng(seed)
    rows = []
    for name, node, grad in checks:
        base = xs[0] if node is None else _node_value(engine, xs, node)
        worst = 0.0
        size = max(float(np.abs(np.asarray(base)).max()), 1e-3)
        # Exact zeros (ReLU outputs) tie in the max-pools above them, where the function has no derivative and
        # central differences average the two sides: the directions leave them alone.
        generic = np.asarray(base) != 0
        for _ in range(directions):
            v = rng.normal(size=grad.shape) * generic
            v /= np.linalg.norm(v) or 1.0
            analytic = float(np.sum(grad * v))
            # ReLUs and max-pools are piecewise linear: a large step crosses kinks, a small one drowns in float32
            # rounding. The best of three step sizes is the derivative's estimate.
            errors = []
            for h in (1e-2 * size, 1e-3 * size, 1e-4 * size):
                f_plus = _scalar(engine, xs, target, class_idx, node, base + h * v.astype(np.float32))
                f_minus = _scalar(engine, xs, target, class_idx, node, base - h * v.astype(np.float32))
                fd = (f_plus - f_minus) / (2 * h)
                errors.append(abs(analytic - fd) / max(abs(fd), abs(analytic), 1e-8))
            worst = max(worst, min(errors))
        rows.append(FiniteDifferenceRow(name, worst, worst > tolerance))
    return rows


def _nodes_below(graph: Any, nodes: set[str]) -> set[str]:
    out, stack = set(), list(nodes)
    while stack:
        n = stack.pop()
        if n in out:
            continue
        out.add(n)
        stack.extend(graph.node(n).inputs)
    return out


def _node_value(engine: Any, xs: list, node: str) -> Any:
    _, node_values = engine._run(xs, {})
    return node_values[node][0]


def _scalar(engine: Any, xs: list, target: Target, class_idx: Any, node: str | None, value: Any) -> float:
    """The target's value with the model input (``node`` None) or ``node``'s output replaced by ``value``,
    computed in float64-accumulated eager passes (the plain forward, no rules)."""
    if node is None:
        values, node_values = engine._run([tf.convert_to_tensor(value), *xs[1:]], {})
    else:
        replaced = tf.convert_to_tensor(value)
        values, node_values = engine._run(xs, {}, transforms={node: lambda outs: [replaced, *outs[1:]]})
    scalar, _ = engine._target_scalar(target, values, node_values, class_idx)
    return float(scalar)


__all__ = [
    "ConservationRow",
    "FiniteDifferenceRow",
    "RandomisationRow",
    "SanityReport",
    "finite_differences",
    "model_randomisation",
    "sanity_checks",
    "spearman",
]
