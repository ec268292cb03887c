"""Plans: an ordered list of (selector -> rule + params). Plain data, JSON round-trippable.

Selectors (later entries win where several match a node):

- ``node:<id>`` (or a bare node id): exactly that node; an error if the rule cannot run there.
- ``type:<OpType>[,<OpType>...]``: every node of those Keras classes (``Conv2D``, ``Activation``...).
- ``activation:<name>[,...]``: every activation node (standalone or split off a fused ``activation=``).
- ``name:<regex>``: node ids matching the regular expression.
- ``group:<id>``: every node inside a nested model.
- ``*``: every node.

Broad selectors skip nodes the rule does not apply to (``Rule.applies_to``); ``Plan.resolve`` reports them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradscope.core.display import RichDisplay
from gradscope.core.errors import PlanError
from gradscope.core.formats import PLAN_SCHEMA, PlanDocument, PlanFile, decode, read_file
from gradscope.core.graph import LayerGraph, NodeSpec
from gradscope.core.resources import bundled
from gradscope.rules.base import Rule, get_rule_class, make_params

_KINDS = ("node", "type", "activation", "name", "group")


@dataclass(frozen=True)
class PlanEntry:
    select: str
    rule: str
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Wrong types are refused where an entry is made (``with_entry(5, ...)`` failed later, deep in
        ``resolve``, as "'int' object has no attribute 'strip'")."""
        for name, kind, words in (
            ("select", str, "a selector such as 'conv1' or 'type:Dense'"),
            ("rule", str, "a rule name (gradscope rules)"),
            ("params", dict, "a dict"),
        ):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise PlanError(f"A plan entry's {name} must be {words}; got {type(value).__name__} {value!r:.60}.")

    def matches(self, node: NodeSpec) -> bool:
        kind, value = parse_selector(self.select)
        if kind == "*":
            return True
        if kind == "node":
            return node.id == value
        if kind == "type":
            return node.op_type in _split(value)
        if kind == "activation":
            return node.activation is not None and node.activation in _split(value)
        if kind == "name":
            return re.search(value, node.id) is not None
        if kind == "group":
            return node.group == value or (node.group or "").startswith(value + "/")
        return False

    def to_dict(self) -> dict[str, Any]:
        return {"select": self.select, "rule": self.rule, "params": dict(self.params)}


def _split(value: str) -> set[str]:
    return {v.strip() for v in value.split(",") if v.strip()}


def parse_selector(select: str) -> tuple[str, str]:
    select = select.strip()
    if select in ("*", "all"):
        return "*", ""
    kind, sep, value = select.partition(":")
    if sep and kind in _KINDS:
        if not value:
            raise PlanError(f"Selector {select!r} has nothing after {kind!r}.")
        if kind == "name":
            try:
                re.compile(value)
            except re.error as exc:
                raise PlanError(f"Selector {select!r}: bad regular expression: {exc}") from None
        return kind, value
    return "node", select  # a bare node id (ids may contain ':' as in 'conv1:pre')


@dataclass(frozen=True)
class ResolvedRule:
    node_id: str
    entry: PlanEntry
    rule: Rule


@dataclass(frozen=True)
class Resolution:
    """What a plan does on one graph: the rule per node, and what it could not do."""

    rules: dict[str, ResolvedRule]
    skipped: dict[str, list[str]]  # selector -> node ids it matched where its rule does not apply
    unmatched: list[str]  # selectors that matched no node at all

    @property
    def rule_by_node(self) -> dict[str, Rule]:
        """Node id -> the rule object that runs there (what the backward passes take)."""
        return {nid: r.rule for nid, r in self.rules.items()}


@dataclass(frozen=True)
class Plan(RichDisplay):
    """Ordered selector -> rule entries (later entries win); data, saved as JSON. Shows itself in a notebook."""

    _html_maker = "gradscope.app.display.reports:plan_html"  # in a notebook (gradscope.core.display)

    def summary(self) -> str:
        entries = "; ".join(f"{e.select} -> {e.rule}" for e in self.entries[:4]) + (
            " ..." if len(self.entries) > 4 else ""
        )
        return f"<Plan {self.name!r}: {entries or 'no entries (the gradient)'}>"

    entries: tuple[PlanEntry, ...] = ()
    name: str = ""
    schema: int = PLAN_SCHEMA  # the node-id scheme its selectors use (1: read from an old file, see ``upgraded``)

    # ------------------------------------------------------------------------------------------- editing
    def with_entry(self, select: str, rule: str, params: dict[str, Any] | None = None) -> Plan:
        params = {} if params is None else dict(params) if isinstance(params, dict) else params  # PlanEntry checks
        return Plan(self.entries + (PlanEntry(select, rule, params),), self.name, self.schema)

    def without(self, index: int) -> Plan:
        return Plan(self.entries[:index] + self.entries[index + 1 :], self.name, self.schema)

    def upgraded(self, graph: LayerGraph) -> Plan:
        """The same plan with today's node ids (``LayerGraph.id_from_v1``); ``resolve`` does this itself.

        A schema-1 plan's ``conv:act`` is today's ``conv`` and its ``conv`` (a layer with a fused activation)
        today's ``conv:pre``. ``name:`` regular expressions are kept as written.
        """
        if self.schema >= PLAN_SCHEMA:
            return self
        entries = []
        for e in self.entries:
            kind, value = parse_selector(e.select)
            select = e.select
            if kind == "node":
                new = graph.id_from_v1(value)
                select = new if select.strip() == value else f"node:{new}"
            entries.append(PlanEntry(select, e.rule, dict(e.params)))
        return Plan(tuple(entries), self.name)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def is_identity(self) -> bool:
        return all(get_rule_class(e.rule).passthrough for e in self.entries)

    # ------------------------------------------------------------------------------------------- resolve
    def resolve(self, graph: LayerGraph) -> Resolution:
        if self.schema < PLAN_SCHEMA:
            return self.upgraded(graph).resolve(graph)
        rules: dict[str, ResolvedRule] = {}
        skipped: dict[str, list[str]] = {}
        unmatched: list[str] = []
        for entry in self.entries:
            cls = get_rule_class(entry.rule)
            params = make_params(cls, entry.params)
            kind, value = parse_selector(entry.select)
            if kind == "node" and value not in graph:
                graph.node(value)  # raises GraphError with suggestions
            hits = [n for n in graph.nodes if entry.matches(n)]
            if not hits:
                unmatched.append(entry.select)
            for node in hits:
                if not cls.applies_to(node):
                    if kind == "node":
                        raise PlanError(
                            f"Rule {entry.rule!r} cannot run on node {node.id!r} ({node.op_type}): {cls.describe()}"
                        )
                    skipped.setdefault(entry.select, []).append(node.id)
                    continue
                rules[node.id] = ResolvedRule(node.id, entry, cls(params))
        # Passthrough rules (identity) are the same as no rule: drop them so the engine takes the fast path.
        rules = {k: v for k, v in rules.items() if not type(v.rule).passthrough}
        return Resolution(rules, skipped, unmatched)

    def key(self) -> str:
        """A short stable hash of the plan's content (trace-cache key; equal plans share a trace)."""
        blob = json.dumps([self.schema, [e.to_dict() for e in self.entries]], sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    # ------------------------------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "name": self.name, "entries": [e.to_dict() for e in self.entries]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Any, *, what: str = "The plan") -> Plan:
        """A plan from parsed JSON: ``{"entries": [...]}`` or a bare list of entries, checked against the one
        declared format (``core.formats.PlanFile``): unknown keys, a missing ``select`` and wrong types are
        errors naming the place."""
        return cls._from_document(decode(data, PlanDocument, what=what, error=PlanError, parsed=True), what)

    @classmethod
    def from_json(cls, text: str | bytes, *, what: str = "The plan") -> Plan:
        """A plan from JSON text (UTF-8, a byte-order mark allowed)."""
        return cls._from_document(decode(text, PlanDocument, what=what, error=PlanError), what)

    @classmethod
    def _from_document(cls, doc: Any, what: str) -> Plan:
        if isinstance(doc, list):
            doc = PlanFile(entries=doc)
        if doc.schema > PLAN_SCHEMA:
            raise PlanError(f"{what} has schema {doc.schema}, newer than this gradscope understands ({PLAN_SCHEMA}).")
        if doc.schema < 1:
            raise PlanError(f"{what} has schema {doc.schema}; plan schemas start at 1.")
        return cls(tuple(PlanEntry(e.select, e.rule, dict(e.params)) for e in doc.entries), doc.name, doc.schema)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """A plan file (UTF-8, a byte-order mark allowed), checked like ``from_dict``."""
        path = bundled(path)
        return cls._from_document(read_file(path, PlanDocument, what="plan file", error=PlanError), str(path))

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON, atomically (an existing plan file is never left half-written)."""
        from gradscope.core.files import write_text_atomic

        write_text_atomic(path, self.to_json() + "\n")
