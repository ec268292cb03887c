"""Method presets: build a plan from the graph by layer type (gradient, guided backprop, MWP, LRP...).

A preset is a function ``(graph, **options) -> Method`` registered with ``@register_method``. It must say which
nodes it changed; a preset that matches nothing on a model says so (``Method.warnings``) instead of silently
giving the plain gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradscope.core.errors import PlanError
from gradscope.core.graph import LayerGraph
from gradscope.rules.base import _ensure_loaded, get_rule_class, make_params
from gradscope.rules.plan import Plan, PlanEntry


@dataclass(frozen=True)
class Method:
    """A plan plus how to read its result out as a map."""

    name: str
    plan: Plan
    reduction: str = "max_abs"  # channel reduction of the map (render.reduce modes)
    times_input: bool = False  # multiply the signal by the input (gradient x input)
    signed: bool = False  # show with a diverging colormap
    readout_node: str | None = None  # default node to read the map at (None: the model input)
    grad_cam: bool = False  # weight the read-out node's value by its channel-mean gradient (Grad-CAM)
    sampling: str | None = None  # "smoothgrad" / "integrated_gradients": average the input gradient over copies
    changed: tuple[str, ...] = ()  # node ids the preset assigned a rule to
    warnings: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)


MethodBuilder = Callable[..., Method]
_METHODS: dict[str, tuple[MethodBuilder, str]] = {}


def register_method(name: str, summary: str = "") -> Callable[[MethodBuilder], MethodBuilder]:
    def decorate(fn: MethodBuilder) -> MethodBuilder:
        _METHODS[name] = (fn, summary or (fn.__doc__ or name).strip().splitlines()[0])
        return fn

    return decorate


def available_methods() -> dict[str, str]:
    """Method name -> one-line summary."""
    _ensure_loaded()
    return {k: v[1] for k, v in sorted(_METHODS.items())}


def build_method(name: str, graph: LayerGraph, **options: Any) -> Method:
    """The preset ``name`` applied to ``graph`` (raises PlanError for an unknown name or bad options)."""
    _ensure_loaded()
    if name not in _METHODS:
        raise PlanError(f"Unknown method {name!r}. Known methods: {', '.join(sorted(_METHODS))}.")
    try:
        return _METHODS[name][0](graph, **options)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PlanError(f"Method {name!r}: bad options {options}: {exc}") from None


def changed_nodes(graph: LayerGraph, plan: Plan) -> tuple[str, ...]:
    """Node ids a plan assigns a non-identity rule to (for ``Method.changed``)."""
    return tuple(plan.resolve(graph).rules)


@register_method("gradient", "Plain gradient (true VJP everywhere)")
def gradient(graph: LayerGraph) -> Method:
    return Method("gradient", Plan(name="gradient"), reduction="max_abs")


@register_method("grad_cam", "Grad-CAM: ReLU(sum_c mean(dy/dA_c) A_c) at the last feature map (Selvaraju 2017)")
def grad_cam(graph: LayerGraph, layer: str | None = None) -> Method:
    from gradscope.rules.builtin.linear_ops import (
        classifier_node,
        feature_map_node,
        large_enough_map,
        readout_min_size,
    )

    if layer is not None:
        node = graph.node(layer)
    else:
        top = classifier_node(graph)
        node = feature_map_node(graph, top) if top is not None else None
        if node is None:  # no classifier to walk up from: the last node with a spatial output
            spatial = [n for n in graph.nodes if len(n.output_shape) == 4 and not n.is_input]
            node = spatial[-1] if spatial else None
        if node is not None:  # a map too coarse to point at anything: the first larger one above it
            node = large_enough_map(graph, node, readout_min_size(graph))
    if node is None or len(node.output_shape) < 3:
        raise PlanError(
            f"Grad-CAM needs a spatial feature map (H, W, C); model {graph.model_name!r} has none"
            + (f" at {layer!r}" if layer else "")
            + ". Give one with layer=NODE."
        )
    return Method(
        "grad_cam",
        Plan(name="grad_cam"),
        reduction="sum_clamped",
        readout_node=node.id,
        grad_cam=True,
        options={"layer": layer},
    )


@register_method("smoothgrad", "SmoothGrad: mean input gradient over noisy copies (Smilkov et al. 2017)")
def smoothgrad(graph: LayerGraph, samples: int = 16, noise: float = 0.15, seed: int = 0) -> Method:
    if int(samples) < 1 or not math.isfinite(float(noise)) or float(noise) < 0:
        raise ValueError(f"samples must be >= 1 and noise a number >= 0 (got {samples!r} and {noise!r})")
    return Method(
        "smoothgrad",
        Plan(name="smoothgrad"),
        reduction="max_abs",
        sampling="smoothgrad",
        options={"samples": int(samples), "noise": float(noise), "seed": int(seed)},
    )


@register_method("integrated_gradients", "Integrated gradients from a black baseline (Sundararajan et al. 2017)")
def integrated_gradients(graph: LayerGraph, steps: int = 32) -> Method:
    if int(steps) < 1:
        raise ValueError(f"steps must be >= 1 (got {steps!r})")
    return Method(
        "integrated_gradients",
        Plan(name="integrated_gradients"),
        reduction="sum",
        signed=True,
        sampling="integrated_gradients",
        options={"steps": int(steps)},
    )


@register_method("gradient_x_input", "Gradient times input (at the input or any layer)")
def gradient_x_input(graph: LayerGraph) -> Method:
    return Method("gradient_x_input", Plan(name="gradient_x_input"), reduction="sum", times_input=True, signed=True)


# ------------------------------------------------------------------------- transformers (AttnLRP, CP-LRP)
def _transformer_method(name: str, entries: list[tuple[str, str, dict]], graph: LayerGraph) -> Method:
    """Rules in gradient form (``rules.builtin.transformer``, ``.attention``), read out times the input; a
    selector that matches nothing is left out. Never silently the gradient: a model with no attention or
    normalisation, and every block that stayed one node (its call could not be opened, so the rules cannot
    reach the attention and norms inside it), are named in the warnings."""
    from gradscope.core.graph import KEPT_WHOLE
    from gradscope.rules.builtin.attention import is_attention
    from gradscope.rules.builtin.transformer import is_norm

    entries = [(s, r, p) for s, r, p in entries if not s.endswith(":")]  # a kind the model has none of
    used = tuple(PlanEntry(s, r, p) for s, r, p in entries if any(PlanEntry(s, r, p).matches(n) for n in graph.nodes))
    plan = Plan(used, name=name)
    changed = changed_nodes(graph, plan)
    warnings = [
        f"{name}: block {n.id!r} ({n.op_type}) stayed one node ({n.config[KEPT_WHOLE]}): the rules cannot reach "
        "the attention and norms inside it, so there the map is the plain gradient."
        for n in graph.nodes
        if KEPT_WHOLE in n.config
    ]
    if not any(is_attention(n) or is_norm(n) for n in graph.nodes):
        warnings.append(
            f"{name}: the model has no attention layer or normalisation: this is {name}'s rule set on the rest."
        )
    return Method(name, plan, reduction="sum", times_input=True, signed=True, changed=changed, warnings=tuple(warnings))


def _types(graph: LayerGraph, keep: Callable[[Any], bool]) -> str:
    return ",".join(sorted({n.op_type for n in graph.nodes if keep(n)}))


@register_method("attnlrp", "AttnLRP: uniform rule on attention, constant norms, identity on GELU (LXT 2024)")
def attnlrp(graph: LayerGraph, epsilon: float = 0.0) -> Method:
    """LXT's ``efficient`` AttnLRP: attention by the uniform rule, norms with a constant normaliser, every smooth
    activation by the identity rule, a product of two activations (a gated MLP) by the uniform rule; linear
    layers plain, as LXT leaves them (their gradient x input is LRP-0). ``epsilon`` > 0 puts the ε rule on linear
    layers and attention's products (it differed from LXT by 0.7 % on a tiny Llama 3 at 1e-6)."""
    from gradscope.rules.builtin.attention import is_attention
    from gradscope.rules.builtin.experts import is_expert_mixture
    from gradscope.rules.builtin.transformer import SMOOTH_ACTIVATIONS, is_norm

    eps = {"epsilon": float(epsilon)}
    linear = [("type:Dense,EinsumDense,Conv1D,Conv2D,Conv3D", "epsilon_gx", eps)] if epsilon else []
    return _transformer_method(
        "attnlrp",
        [
            (f"type:{_types(graph, is_attention)}", "attention_lrp", eps),
            (f"type:{_types(graph, is_expert_mixture)}", "experts_lrp", {}),
            (f"type:{_types(graph, is_norm)}", "norm_constant", {}),
            *linear,
            (f"activation:{','.join(sorted(SMOOTH_ACTIVATIONS))}", "act_identity", {}),
            ("type:Multiply", "product_uniform", {}),
        ],
        graph,
    )


@register_method("cp_lrp", "CP-LRP: attention probabilities and LayerNorm scale held constant (Ali et al. 2022)")
def cp_lrp(graph: LayerGraph) -> Method:
    """LXT's CP-LRP: attention probabilities and norms' normalisers constant, the identity rule on activations,
    a gated MLP's gate held constant."""
    from gradscope.rules.builtin.attention import is_attention
    from gradscope.rules.builtin.experts import is_expert_mixture
    from gradscope.rules.builtin.transformer import SMOOTH_ACTIVATIONS, gated_products, is_norm

    gates = [(f"node:{node}", "product_gate_constant", {"gate": k}) for node, k in gated_products(graph).items()]
    return _transformer_method(
        "cp_lrp",
        [
            (f"type:{_types(graph, is_attention)}", "attention_cp", {}),
            (f"type:{_types(graph, is_expert_mixture)}", "experts_cp", {}),
            (f"type:{_types(graph, is_norm)}", "norm_constant", {}),
            (f"activation:{','.join(sorted(SMOOTH_ACTIVATIONS))}", "act_identity", {}),
            *gates,
        ],
        graph,
    )


# ------------------------------------------------------------------------- guided backprop / deconvnet (§2.2)
def _relu_method(name: str, rule: str, graph: LayerGraph) -> Method:
    """Every ReLU-like node gets ``rule``; everything else (max-pool, BN, ...) keeps its true VJP."""
    from gradscope.rules.builtin.relu_family import relu_selectors
    from gradscope.rules.plan import PlanEntry

    # Only selectors that match something, so the result does not report an 'unmatched' selector as a problem.
    entries = [PlanEntry(s, rule) for s in relu_selectors()]
    used = tuple(e for e in entries if any(e.matches(n) for n in graph.nodes)) or tuple(entries[:1])
    plan = Plan(used, name=name)
    changed = changed_nodes(graph, plan)
    warnings: tuple[str, ...] = ()
    if not changed:
        warnings = (
            f"{name}: the model has no ReLU-like node (ReLU, ReLU6, LeakyReLU), so this is the plain gradient.",
        )
    return Method(name, plan, reduction="max_abs", changed=changed, warnings=warnings)


@register_method("guided_backprop", "Guided backprop: ReLU passes g*1[z>0]*1[g>0] (Springenberg et al. 2015)")
def guided_backprop(graph: LayerGraph) -> Method:
    return _relu_method("guided_backprop", "guided_backprop", graph)


@register_method("deconvnet", "Deconvnet: ReLU passes max(g, 0), forward mask ignored (Zeiler & Fergus 2014)")
def deconvnet(graph: LayerGraph) -> Method:
    return _relu_method("deconvnet", "deconvnet", graph)


# ------------------------------------------------------------------------- Excitation Backprop / c-MWP (§2.3-2.4)
@register_method("mwp", "Excitation Backprop (MWP): W+, bias dropped, x*W+^T(g/z) (Zhang et al. 2016)")
def mwp(
    graph: LayerGraph, signed_input: str = "mwp_split", batchnorm: str = "identity", readout: str | None = None
) -> Method:
    return mwp_method(graph, signed_input=signed_input, batchnorm=batchnorm, readout=readout)


@register_method("cmwp", "Contrastive MWP: MWP(W) - MWP(-W) at the classifier, read at the last feature map")
def cmwp(
    graph: LayerGraph,
    signed_input: str = "mwp_split",
    batchnorm: str = "identity",
    readout: str | None = None,
    min_size: int | None = None,
) -> Method:
    return mwp_method(
        graph, contrastive=True, signed_input=signed_input, batchnorm=batchnorm, readout=readout, min_size=min_size
    )


# ------------------------------------------------------------------------- LRP (§2.5-2.6)
@register_method("lrp_epsilon", "LRP-epsilon: x*W^T(g/(z+eps*sign(z))), bias included (Bach et al. 2015)")
def lrp_epsilon(graph: LayerGraph, epsilon: float = 0.1, bias: bool = True, readout: str | None = None) -> Method:
    return lrp_method(graph, "lrp_epsilon", "lrp_epsilon", {"epsilon": epsilon, "bias": bias}, readout)


@register_method("lrp_alpha_beta", "LRP-alpha-beta (alpha - beta = 1, default a2b1): signed parts apart")
def lrp_alpha_beta(
    graph: LayerGraph,
    alpha: float = 2.0,
    beta: float = 1.0,
    bias: bool = True,
    stabilizer: float = 1e-6,
    readout: str | None = None,
) -> Method:
    params = {"alpha": alpha, "beta": beta, "bias": bias, "stabilizer": stabilizer}
    return lrp_method(graph, "lrp_alpha_beta", "lrp_alpha_beta", params, readout)


@register_method("lrp_zplus", "LRP-z+ (alpha1-beta0): positive contributions only (Montavon et al. 2017)")
def lrp_zplus(graph: LayerGraph, bias: bool = True, stabilizer: float = 1e-6, readout: str | None = None) -> Method:
    return lrp_method(graph, "lrp_zplus", "lrp_zplus", {"bias": bias, "stabilizer": stabilizer}, readout)


# ------------------------------------------------------------------------- the rule-based presets' plans
def gate_entries(graph: LayerGraph) -> tuple[list[PlanEntry], set[str]]:
    """Plan entries giving every gating Multiply the signal-take-all rule, and their node ids."""
    from gradscope.rules.builtin.linear_ops import gate_nodes

    gates = gate_nodes(graph)
    return [PlanEntry(node_id, "signal_take_all", {"gate": k}) for node_id, k in gates.items()], set(gates)


#: Node kinds that get the ``mwp`` rule in the presets (the others keep the true gradient, which is their rule).
MWP_KINDS = ("linear", "separable", "avg_pool", "sum", "batchnorm", "scale", "activation")


def mwp_method(
    graph: LayerGraph,
    *,
    contrastive: bool = False,
    signed_input: str = "mwp_split",
    batchnorm: str = "identity",
    readout: str | None = None,
    min_size: int | None = None,
) -> Method:
    """The ``mwp`` / ``cmwp`` presets: the plan, the read-out node and what the plan could not handle.
    ``min_size``: smallest side of c-MWP's default read-out map (default ``readout_min_size``: 7, or 1/8 of a
    smaller input)."""
    from gradscope.rules.builtin.excitation import MWPParams
    from gradscope.rules.builtin.linear_ops import (
        classifier_node,
        feature_map_node,
        large_enough_map,
        node_kind,
        readout_min_size,
        rule_selectors,
        stripped_softmax_ids,
        unhandled_warnings,
    )

    name = "cmwp" if contrastive else "mwp"
    try:
        MWPParams(signed_input, batchnorm)
    except ValueError as exc:
        raise PlanError(f"Method {name!r}: {exc}.") from None
    params: dict[str, Any] = {}
    if signed_input != "mwp_split":
        params["signed_input"] = signed_input
    if batchnorm != "identity":
        params["batchnorm"] = batchnorm
    kinds = set(MWP_KINDS) - ({"batchnorm"} if batchnorm == "true_gradient" else set())
    gates, gate_ids = gate_entries(graph)
    skip = stripped_softmax_ids(graph) | gate_ids
    ids = [n.id for n in graph.nodes if node_kind(n) in kinds and n.id not in skip]
    entries = [PlanEntry(s, "mwp", params) for s in rule_selectors(graph, ids)] + gates
    warnings = list(unhandled_warnings(graph, name, skip=tuple(gate_ids)))
    readout_node = readout
    if contrastive:
        top = classifier_node(graph)
        if top is None:
            raise PlanError(
                "c-MWP needs a linear classifier layer (Dense or 1x1 conv) that produces the logits; "
                f"model {graph.model_name!r} has none. Use 'mwp' instead."
            )
        cparams = {"signed_input": signed_input} if signed_input != "mwp_split" else {}
        entries.append(PlanEntry(top.id, "cmwp", cparams))
        if readout is None:
            feature = feature_map_node(graph, top)
            if feature is not None:
                feature = large_enough_map(graph, feature, readout_min_size(graph) if min_size is None else min_size)
            if feature is None:
                warnings.append(
                    "cmwp: found no spatial feature map under the classifier; the map is read at the input."
                )
            readout_node = feature.id if feature is not None else None
    if readout_node in ("input", ""):
        readout_node = None
    if readout_node is not None:
        graph.node(readout_node)  # a clear error for a typo
    plan = Plan(tuple(entries), name=name)
    return Method(
        name,
        plan,
        reduction="sum_clamped" if contrastive else "sum",
        readout_node=readout_node,
        changed=changed_nodes(graph, plan),
        warnings=tuple(warnings),
        options={"signed_input": signed_input, "batchnorm": batchnorm, "readout": readout, "min_size": min_size},
    )


#: Node kinds that get the LRP rule in the presets (ReLU, max pools and reshapes keep their true gradient).
LRP_KINDS = ("linear", "separable", "avg_pool", "sum", "batchnorm", "scale", "activation")


def lrp_method(graph: LayerGraph, name: str, rule: str, params: dict[str, Any], readout: str | None = None) -> Method:
    """An LRP preset: ``rule`` with ``params`` on every node kind in ``LRP_KINDS``; signed ``Σ_c`` map."""
    from gradscope.rules.builtin.linear_ops import node_kind, rule_selectors, stripped_softmax_ids, unhandled_warnings

    make_params(get_rule_class(rule), params)  # bad options fail here, with the rule's message
    gates, gate_ids = gate_entries(graph)
    skip = stripped_softmax_ids(graph) | gate_ids
    ids = [n.id for n in graph.nodes if node_kind(n) in LRP_KINDS and n.id not in skip]
    entries = [PlanEntry(s, rule, dict(params)) for s in rule_selectors(graph, ids)] + gates
    plan = Plan(tuple(entries), name=name)
    if readout in ("input", ""):
        readout = None
    if readout is not None:
        graph.node(readout)
    return Method(
        name,
        plan,
        reduction="sum",
        signed=True,
        readout_node=readout,
        changed=changed_nodes(graph, plan),
        warnings=unhandled_warnings(graph, name, skip=tuple(gate_ids)),
        options=dict(params),
    )
