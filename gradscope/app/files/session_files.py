"""Session files (``*.gradscope.json``): what a saved session holds, reading it back, and the class names a
model's description file beside it provides."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradscope.app.rendering.view import INPUT_KEY, ViewSettings
from gradscope.core.errors import GradscopeError
from gradscope.core.files import write_text_atomic
from gradscope.core.formats import SESSION_SCHEMA, SessionFile, encode, read_file
from gradscope.core.graph import LayerGraph
from gradscope.core.json_text import read_json_file
from gradscope.core.targets import Target
from gradscope.rules.plan import Plan

SESSION_SUFFIX = ".gradscope.json"


@dataclass
class Restore:
    """A session file's settings, applied once its model has loaded."""

    plan: Plan
    target: Target
    view: ViewSettings
    image: str | None
    selected: str | None
    method: str | None
    preprocessing: str
    schema: int = SESSION_SCHEMA  # the node-id scheme of its ids (1: "<id>:act" for a split activation)
    tokens: str | None = None
    vocabulary: str | None = None

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Restore:
        """The settings of a session file's parsed, checked contents (``read_session_file``)."""
        return cls(
            Plan.from_dict(data.get("plan") or {}),
            Target.from_dict(data.get("target") or {}),
            ViewSettings.from_dict(data.get("view") or {}),
            data.get("image"),
            data.get("selected"),
            data.get("method"),
            data.get("preprocessing") or "unit",
            data.get("schema", SESSION_SCHEMA),
            data.get("tokens"),
            data.get("vocabulary"),
        )

    def fitted(self, graph: LayerGraph) -> tuple[Restore, list[str]]:
        """The settings for ``graph``: ids upgraded (``upgraded``), and the selection, read-out node and target
        node dropped (to nothing, the input and top-1) where the model has no such node; returns those ids too."""
        new = self.upgraded(graph)
        missing = [i for i in (new.selected, new.view.readout_node, new.target.node) if i and i != INPUT_KEY]
        missing = list(dict.fromkeys(i for i in missing if i not in graph))
        if not missing:
            return new, []
        view = new.view
        if view.readout_node in missing:
            view = dataclasses.replace(view, readout_node=INPUT_KEY)
        target = Target() if new.target.node in missing else new.target
        selected = None if new.selected in missing else new.selected
        return dataclasses.replace(new, view=view, target=target, selected=selected), missing

    def upgraded(self, graph: LayerGraph) -> Restore:
        """The same settings with today's node ids (``LayerGraph.id_from_v1``) when the file is schema 1."""
        if self.schema >= 2:  # ids of today's scheme (schema 3 only added tokens and the vocabulary)
            return self

        def new(node_id: str | None) -> str | None:
            return graph.id_from_v1(node_id) if node_id else node_id

        target = dataclasses.replace(self.target, node=new(self.target.node)) if self.target.node else self.target
        view = self.view
        if view.readout_node and view.readout_node != INPUT_KEY:
            view = dataclasses.replace(view, readout_node=new(view.readout_node))
        plan = self.plan.upgraded(graph)
        selected = new(self.selected)
        return dataclasses.replace(self, plan=plan, target=target, view=view, selected=selected, schema=SESSION_SCHEMA)


def session_data(
    *,
    model: str | None,
    custom_objects: str | None,
    image: str | None,
    preprocessing: str,
    target: Target,
    method: str,
    plan: Plan,
    view: ViewSettings,
    selected: str | None,
    tokens: str | None = None,
    vocabulary: str | None = None,
) -> dict[str, Any]:
    """What a session file holds (``write_session_file``)."""
    return {
        "schema": SESSION_SCHEMA,
        "model": model,
        "custom_objects": custom_objects,
        "image": image,
        "preprocessing": preprocessing,
        "target": target.to_dict(),
        "method": method,
        "plan": plan.to_dict(),
        "view": view.to_dict(),
        "selected": selected,
        "tokens": tokens,
        "vocabulary": vocabulary,
    }


def write_session_file(path: str | Path, data: dict[str, Any]) -> Path:
    """Write ``data`` atomically, named ``*.gradscope.json``; returns the path written."""
    path = Path(path)
    if not path.name.endswith(SESSION_SUFFIX):
        path = path.with_name(path.name.removesuffix(".json") + SESSION_SUFFIX)
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
    return path


class SessionFileError(GradscopeError):
    """A session file is unreadable or from a newer gradscope."""


def read_session_file(path: str | Path) -> dict[str, Any]:
    """The session file as plain JSON values, checked against ``core.formats.SessionFile`` (and its plan, target
    and view against theirs) before anything changes."""
    p = Path(path)
    doc = read_file(p, SessionFile, what="session file", error=SessionFileError)
    if doc.schema > SESSION_SCHEMA:
        raise SessionFileError(f"{p.name} has session schema {doc.schema}; this gradscope reads {SESSION_SCHEMA}.")
    if not doc.model:
        raise SessionFileError(f"{p.name} names no model file.")
    data = encode(doc)
    try:
        Plan.from_dict(data["plan"])
        Target.from_dict(data["target"])
        ViewSettings.from_dict(data["view"]).check()
    except GradscopeError as exc:
        raise SessionFileError(f"{p.name}: {exc}") from None
    return data


def find_class_names(model_path: str | Path) -> list[str]:
    """Class names from a JSON description beside the model: ``<stem>.json`` or a ``*_meta.json`` whose
    ``name`` is the model's stem (as the bundled demo has), with a ``class_names`` list. Empty if none."""
    p = Path(model_path)
    candidates = [p.with_suffix(".json"), p.parent / f"{p.stem}_meta.json", *sorted(p.parent.glob("*_meta.json"))]
    for c in candidates:
        try:
            data = read_json_file(c, "model description", max_bytes=1 << 20) if c.is_file() else None
        except GradscopeError:
            continue
        if not isinstance(data, dict) or not isinstance(data.get("class_names"), list):
            continue
        if c in candidates[:2] or data.get("name") == p.stem:
            return [str(n) for n in data["class_names"]]
    return []


VOCABULARY_NAMES = ("{stem}.vocab.txt", "{stem}_vocab.txt", "vocab.txt", "vocab.json")


def find_vocabulary(model_path: str | Path) -> Path | None:
    """A vocabulary file beside the model (``<stem>.vocab.txt``, ``<stem>_vocab.txt``, ``vocab.txt`` or
    ``vocab.json``), or a checkpoint folder's own tokenizer: data, never code, so it is read without asking."""
    p = Path(model_path)
    if p.is_dir():  # a checkpoint folder: its own tokenizer, when it has one
        from gradscope.io.checkpoints import has_tokenizer

        return p if has_tokenizer(p) else None
    for pattern in VOCABULARY_NAMES:
        candidate = p.with_name(pattern.format(stem=p.stem))
        if candidate.is_file():
            return candidate
    return None


def session_code_files(path: str | Path) -> list[str]:
    """The Python files a session file would import if allowed (its custom-objects file), for a front end to
    show before asking. Empty for an unreadable file (opening it reports why)."""
    try:
        data = read_session_file(path)
    except GradscopeError:
        return []
    objects = data.get("custom_objects")
    return [str(objects)] if objects else []
