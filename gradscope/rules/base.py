"""The rule API (``Rule``, ``@register_rule``: defined in ``rules.registry``, re-exported here) and the lookups
that need the built-in rules loaded first (``available_rules``, ``get_rule_class``), user rule files and plugins.
The built-ins import TensorFlow, so they are loaded on first lookup, not at import.

A rule replaces the backward pass of the nodes a plan assigns it to::

    @register_rule("halve")
    class Halve(Rule):
        '''Pass half of the upstream gradient through the node's true VJP.'''

        def backward(self, ctx, grad_outputs):
            return ctx.vjp([0.5 * g for g in grad_outputs])

``ctx`` (see ``gradscope.engine.backward.context.RuleContext``) gives the node, its Keras layer, forward inputs and
outputs, its weights by name, and helpers: ``ctx.vjp`` (true VJP, optionally at modified inputs/weights) and
``ctx.forward`` (the node's forward with modified inputs/weights), plus ``ctx.tf``/``ctx.ops`` for math.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gradscope.core.errors import Cancelled, GradscopeError, PlanError, RuleError, RuleFileError
from gradscope.core.resources import bundled
from gradscope.rules.registry import (
    _REGISTRY,
    _SOURCES,
    _VALUE_SOURCES,
    NoParams,
    Rule,
    _current_source,
    _loading,
    make_params,
    params_to_dict,
    register_rule,
    register_value,
)

__all__ = [
    "NoParams",
    "Rule",
    "RulePlugin",
    "available_rules",
    "carries_relevance",
    "get_rule_class",
    "load_rule_file",
    "load_rule_plugins",
    "make_params",
    "params_to_dict",
    "register_rule",
    "register_value",
    "rule_plugins",
    "rule_source",
]


_BUILTINS_LOADED = False


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


def load_rule_file(path: str | Path) -> list[str]:
    """Import a user's Python file of ``@register_rule`` classes; returns the names it registered.

    The file is code: it runs with the user's rights. Only files the user chose are ever loaded.
    """
    _ensure_loaded()
    path = Path(bundled(path)).expanduser().resolve()
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
    added += sorted(f"{n} (value)" for n, src in _VALUE_SOURCES.items() if src == str(path))
    if not added:
        raise RuleFileError(
            f"{path.name} defines no new rules: decorate Rule subclasses with @register_rule (or value functions "
            "with @register_value)."
        )
    return added
