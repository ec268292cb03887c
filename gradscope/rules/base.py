"""The rule API and the rule registry (no TensorFlow import here: rules receive tensors through ``ctx``).

A rule replaces the backward pass of the nodes a plan assigns it to::

    @register_rule("halve")
    class Halve(Rule):
        '''Pass half of the upstream gradient through the node's true VJP.'''

        def backward(self, ctx, grad_outputs):
            return ctx.vjp([0.5 * g for g in grad_outputs])

``ctx`` (see ``gradscope.engine.context.RuleContext``) gives the node, its Keras layer, forward inputs and
outputs, its weights by name, and helpers: ``ctx.vjp`` (true VJP, optionally at modified inputs/weights) and
``ctx.forward`` (the node's forward with modified inputs/weights), plus ``ctx.tf``/``ctx.ops`` for math.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from gradscope.core.errors import Cancelled, GradscopeError, PlanError, RuleError, RuleFileError
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

    def forward_override(self, ctx: Any) -> Sequence[Any] | None:
        """Optional: outputs that the layers *above* see during the backward pass (global substitution).

        The predictions shown to the user always come from the real forward pass.
        """
        return None

    @classmethod
    def overrides_forward(cls) -> bool:
        return cls.forward_override is not Rule.forward_override

    @classmethod
    def describe(cls) -> str:
        doc = (cls.__doc__ or "").strip().splitlines()
        return doc[0] if doc else cls.name


# ---------------------------------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type[Rule]] = {}
_SOURCES: dict[str, str] = {}  # rule name -> "builtin" | entry point | file path
_LOCK = threading.Lock()
_BUILTINS_LOADED = False


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


_current_source: dict[str, str] = {}
_loading: dict[str, str] = {}  # rule name -> class name, registered by the file or plugin being loaded now


def _ensure_loaded() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    import gradscope.rules.builtin  # noqa: F401  (registers the built-in rules)


@dataclasses.dataclass(frozen=True)
class RulePlugin:
    """An installed package's ``gradscope.rules`` entry point, read from its metadata (nothing imported)."""

    name: str
    package: str
    module: str

    def describe(self) -> str:
        return f"{self.name} (package {self.package}, module {self.module})"


def rule_plugins() -> list[RulePlugin]:
    """The rule plugins installed packages offer. They are code: listing them imports nothing, and they are
    loaded only by ``load_rule_plugins`` (``gradscope ... --rule-plugins``), never on first use."""
    from importlib.metadata import entry_points

    found = []
    for ep in entry_points(group="gradscope.rules"):
        dist = getattr(ep, "dist", None)
        found.append(RulePlugin(ep.name, getattr(dist, "name", None) or "?", ep.value))
    return sorted(found, key=lambda p: p.name)


def load_rule_plugins(names: Iterable[str] | None = None) -> list[str]:
    """Import the installed rule plugins (all, or those named): the caller's explicit choice. Returns the new
    rule names. A plugin may not replace a built-in rule: the clash is a ``RuleError`` naming both."""
    from importlib.metadata import entry_points

    _ensure_loaded()
    wanted = None if names is None else set(names)
    before = set(_REGISTRY)
    for ep in entry_points(group="gradscope.rules"):
        if wanted is not None and ep.name not in wanted:
            continue
        dist = getattr(ep, "dist", None)
        source = f"plugin {ep.name} (package {getattr(dist, 'name', None) or '?'})"
        _current_source["value"] = source
        _loading.clear()
        try:
            ep.load()
        except GradscopeError:
            raise
        except (Exception, SystemExit) as exc:
            raise RuleError(f"Cannot load rule {source}: {type(exc).__name__}: {exc}") from exc
        finally:
            _current_source.pop("value", None)
            _loading.clear()
    return sorted(set(_REGISTRY) - before)


def available_rules() -> dict[str, type[Rule]]:
    _ensure_loaded()
    return dict(sorted(_REGISTRY.items()))


def rule_source(name: str) -> str:
    return _SOURCES.get(name, "?")


def carries_relevance(rule_names: Any) -> bool:
    """True when any of these rules passes relevance down (``Rule.relevance``): below them, a signal is
    relevance, not a gradient."""
    rules = available_rules()
    return any(getattr(rules.get(name), "relevance", False) for name in rule_names)


def get_rule_class(name: str) -> type[Rule]:
    _ensure_loaded()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise PlanError(f"Unknown rule {name!r}. Known rules: {known}.") from None


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


def load_rule_file(path: str | Path) -> list[str]:
    """Import a user's Python file of ``@register_rule`` classes; returns the names it registered.

    The file is code: it runs with the user's rights. Only files the user chose are ever loaded.
    """
    _ensure_loaded()
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise RuleFileError(f"Rule file not found: {path}")
    module_name = f"gradscope_user_rules_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RuleFileError(f"{path.name} is not a Python file that can be imported.")
    module = importlib.util.module_from_spec(spec)
    _current_source["value"] = str(path)
    _loading.clear()
    try:
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except RuleError as exc:
        raise RuleFileError(f"{path.name}: {exc}") from exc
    except Cancelled:  # the user stopped a file that did not finish importing (the window's Cancel)
        sys.modules.pop(module_name, None)
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() in a rule file must not end the app
        sys.modules.pop(module_name, None)
        line = ""
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(path):
                line = f" (line {tb.tb_lineno})"
            tb = tb.tb_next
        raise RuleFileError(f"{path.name} failed to import{line}: {type(exc).__name__}: {exc}") from exc
    finally:
        _current_source.pop("value", None)
        _loading.clear()
    added = sorted(n for n, src in _SOURCES.items() if src == str(path))
    if not added:
        raise RuleFileError(f"{path.name} defines no new rules: decorate Rule subclasses with @register_rule.")
    return added
