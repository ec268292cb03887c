"""The rule API (``Rule``, ``@register_rule``) and the registry it fills, with nothing that looks rules up: the
built-in rules import this module to register themselves, and ``rules.base`` (which loads them on first use)
imports it too, so no module imports back what imports it. No TensorFlow here: rules receive tensors through
``ctx``."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from gradscope.core.errors import PlanError, RuleError
from gradscope.core.graph import NodeSpec


@dataclasses.dataclass(frozen=True)
class NoParams:
    """Parameters of a rule that takes none."""


class Rule:
    """Base class of every backward rule. Subclasses set ``name`` (via ``@register_rule``) and ``Params``."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    #: True for the true gradient: the engine does not wrap the node at all (fast path).
    passthrough: ClassVar[bool] = False
    #: Node types the rule is meant for, shown in the GUI; ``applies_to`` is the real check.
    summary: ClassVar[str] = ""
    #: True when the signal the rule passes down is relevance (``x ⊙ …``: LRP, MWP): it is read as it is, never
    #: multiplied by the input again (RULES_SPEC §1, §4).
    relevance: ClassVar[bool] = False

    def __init__(self, params: Any = None) -> None:
        self.params = params if params is not None else self.Params()

    @classmethod
    def applies_to(cls, node: NodeSpec) -> bool:
        """Whether this rule can run on ``node``. Broad selectors (``type:``, ``*``) skip nodes where it can't."""
        return not node.is_input

    def backward(self, ctx: Any, grad_outputs: list[Any]) -> Sequence[Any]:
        """Return one gradient (or None) per tensor in ``ctx.inputs``."""
        raise NotImplementedError(f"Rule {self.name!r} does not implement backward()")

    def weight_gradients(self, ctx: Any, grad_outputs: list[Any]) -> Sequence[Any] | None:
        """Gradients for ``ctx.weight_list``; None means the true VJP (what training with a plan uses)."""
        return None

    #: True for a rule whose ``forward_override`` is the node's value in the forward pass too (a patch): outputs,
    #: predictions and the loss are the patched model's, and the gradient is plain autodiff through the new value.
    patches_forward: ClassVar[bool] = False

    def forward_override(self, ctx: Any) -> Sequence[Any] | None:
        """Optional: outputs that the layers *above* see during the backward pass (global substitution).

        The predictions shown to the user come from the real forward pass (unless ``patches_forward``).
        """
        return None

    @classmethod
    def overrides_forward(cls) -> bool:
        """Whether the layers above see other values in the backward pass than the forward pass gave."""
        return cls.forward_override is not Rule.forward_override and not cls.patches_forward

    @classmethod
    def changes_values(cls) -> bool:
        """Whether the rule changes any value a layer above sees (a live sweep keeps the forward's values)."""
        return cls.forward_override is not Rule.forward_override

    @classmethod
    def describe(cls) -> str:
        doc = (cls.__doc__ or "").strip().splitlines()
        return doc[0] if doc else cls.name


# ---------------------------------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type[Rule]] = {}
_SOURCES: dict[str, str] = {}  # rule name -> "builtin" | entry point | file path
_LOCK = threading.Lock()


def register_rule(name: str, *, replace: bool = False) -> Callable[[type[Rule]], type[Rule]]:
    """Class decorator: make a ``Rule`` subclass available to plans under ``name``."""

    def decorate(cls: type[Rule]) -> type[Rule]:
        if not (isinstance(cls, type) and issubclass(cls, Rule)):
            raise RuleError(f"@register_rule({name!r}) must decorate a subclass of gradscope.Rule")
        if not dataclasses.is_dataclass(cls.Params):
            raise RuleError(f"Rule {name!r}: Params must be a dataclass")
        with _LOCK:
            source = _current_source.get("value", "builtin")
            same_source = _SOURCES.get(name) == source and source != "builtin"  # re-loading a user file
            existing = _SOURCES.get(name, "?")
            if (
                name in _REGISTRY
                and _REGISTRY[name] is not cls
                and source.startswith("plugin ")
                and (existing == "builtin" or not existing.startswith("plugin "))
            ):
                raise RuleError(
                    f"Rule {source} registers {name!r}, which is already the {existing} rule {name!r}; "
                    "a plugin cannot replace it. Rename the plugin's rule."
                )
            if name in _REGISTRY and _REGISTRY[name] is not cls and not (replace or same_source):
                raise RuleError(f"A rule named {name!r} is already registered (from {existing}).")
            if name in _loading and not replace:  # two classes under one name in one file: which one was meant?
                raise RuleError(
                    f"@register_rule({name!r}) decorates two classes ({_loading[name]} and {cls.__name__}); "
                    "give each rule its own name."
                )
            if _current_source:
                _loading[name] = cls.__name__
            cls.name = name
            _REGISTRY[name] = cls
            _SOURCES[name] = source
        return cls

    return decorate


_VALUE_FUNCTIONS: dict[str, Callable[[Any, Any], Any]] = {}
_VALUE_SOURCES: dict[str, str] = {}  # value function name -> where it came from (a rule file's path)


def register_value(name: str) -> Callable[[Callable], Callable]:
    """Decorator: make ``fn(a1, source) -> a2`` a value source for ``substitute_value`` / ``patch_value``
    (``source="function", function=name``). ``a1`` is the node's value, ``source`` its value on the other input
    given to the run (None when none is). Rule files register them (Python code: loaded only with consent)."""

    def decorate(fn: Callable) -> Callable:
        if not callable(fn):
            raise RuleError(f"@register_value({name!r}) must decorate a function fn(a1, source) -> a2.")
        with _LOCK:
            _VALUE_FUNCTIONS[name] = fn
            _VALUE_SOURCES[name] = _current_source.get("value", "builtin")
        return fn

    return decorate


def value_function(name: str) -> Callable[[Any, Any], Any]:
    if name not in _VALUE_FUNCTIONS:
        known = ", ".join(sorted(_VALUE_FUNCTIONS)) or "none is registered"
        raise RuleError(f"No value function {name!r} (a rule file registers them with @register_value); {known}.")
    return _VALUE_FUNCTIONS[name]


_current_source: dict[str, str] = {}
_loading: dict[str, str] = {}  # rule name -> class name, registered by the file or plugin being loaded now


def make_params(cls: type[Rule], params: dict[str, Any] | None) -> Any:
    """Build ``cls.Params`` from a plain dict, with clear errors for unknown names and wrong types."""
    params = dict(params or {})
    fields = {f.name: f for f in dataclasses.fields(cls.Params)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        valid = ", ".join(fields) or "none"
        raise PlanError(f"Rule {cls.name!r} has no parameter(s) {', '.join(unknown)}; valid: {valid}.")
    values = {}
    for key, value in params.items():
        values[key] = _coerce(cls.name, key, fields[key], value)
    try:
        return cls.Params(**values)
    except (TypeError, ValueError) as exc:
        raise PlanError(f"Rule {cls.name!r}: bad parameters {params}: {exc}") from exc


def _coerce(rule: str, key: str, f: dataclasses.Field, value: Any) -> Any:
    """``value`` checked against the parameter's declared type; a whole number may stand for a float and a
    float with no fraction for an int, nothing else is converted ("2", "yes" used to be read silently)."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "float" and is_number:
        if math.isnan(value):  # NaN silently turned every map into the plain input (exit 0)
            raise PlanError(f"Rule {rule!r}: parameter {key!r} is NaN; give a number.")
        return float(value)
    if kind == "int" and is_number and float(value).is_integer():
        return int(value)
    if (kind == "bool" and isinstance(value, bool)) or (kind == "str" and isinstance(value, str)):
        return value
    if kind in ("float", "int", "bool", "str"):
        words = {"float": "a number", "int": "a whole number", "bool": "true or false", "str": "a string"}[kind]
        raise PlanError(f"Rule {rule!r}: parameter {key!r} must be {words}, got {value!r}.")
    return value


def params_to_dict(params: Any) -> dict[str, Any]:
    return dataclasses.asdict(params) if dataclasses.is_dataclass(params) else {}
