"""Method presets: build a plan from the graph by layer type (gradient, guided backprop, MWP, LRP...).

A preset is a function ``(graph, **options) -> Method`` registered with ``@register_method``. It must say which
nodes it changed; a preset that matches nothing on a model says so (``Method.warnings``) instead of silently
giving the plain gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gradscope.core.errors import PlanError
from gradscope.core.graph import LayerGraph
from gradscope.rules.plan import Plan


@dataclass(frozen=True)
class Method:
    """A plan plus how to read its result out as a map."""

    name: str
    plan: Plan
    reduction: str = "max_abs"  # channel reduction of the map (render.reduce modes)
    times_input: bool = False  # multiply the signal by the input (gradient x input)
    signed: bool = False  # show with a diverging colormap
    readout_node: str | None = None  # default node to read the map at (None: the model input)
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
    from gradscope.rules.base import _ensure_loaded

    _ensure_loaded()
    return {k: v[1] for k, v in sorted(_METHODS.items())}


def build_method(name: str, graph: LayerGraph, **options: Any) -> Method:
    """The preset ``name`` applied to ``graph`` (raises PlanError for an unknown name or bad options)."""
    from gradscope.rules.base import _ensure_loaded

    _ensure_loaded()
    if name not in _METHODS:
        raise PlanError(f"Unknown method {name!r}. Known methods: {', '.join(sorted(_METHODS))}.")
    try:
        return _METHODS[name][0](graph, **options)
    except TypeError as exc:
        raise PlanError(f"Method {name!r}: bad options {options}: {exc}") from None


def changed_nodes(graph: LayerGraph, plan: Plan) -> tuple[str, ...]:
    """Node ids a plan assigns a non-identity rule to (for ``Method.changed``)."""
    return tuple(plan.resolve(graph).rules)


@register_method("gradient", "Plain gradient (true VJP everywhere)")
def gradient(graph: LayerGraph) -> Method:
    return Method("gradient", Plan(name="gradient"), reduction="max_abs")


@register_method("gradient_x_input", "Gradient times input (at the input or any layer)")
def gradient_x_input(graph: LayerGraph) -> Method:
    return Method("gradient_x_input", Plan(name="gradient_x_input"), reduction="sum", times_input=True, signed=True)
