"""The selected node, as a small evented model (the graph view, the inspector and the read-out follow it).

Owns: ``node`` (a node id of the open model, or None).
Emits: ``changed(node id or None)``.
"""

from __future__ import annotations

from gradscope.app.models.document import ModelDocument
from gradscope.core.events import Signal


class Selection:
    def __init__(self, document: ModelDocument) -> None:
        self._document = document
        self.node: str | None = None
        self.changed = Signal("selection_changed")  # (node id or None)

    def select(self, node_id: str | None) -> None:
        """Select ``node_id`` (a node the open model lacks selects nothing)."""
        graph = self._document.graph
        if node_id is not None and graph is not None and node_id not in graph:
            node_id = None
        if node_id != self.node:
            self.node = node_id
            self.changed.emit(node_id)

    def reset(self) -> None:
        """Nothing selected (a new model): quiet, the composition announces the new model."""
        self.node = None
