"""Undo history of the Session: each step is a plan together with the method it came from and the read-out
that method chose, so undoing a preset also gives back the map's node, reduction and caption."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gradscope.rules.plan import Plan

#: The view fields a method preset sets (``ViewSettings.for_method``); colours follow ``signed``.
READOUT_FIELDS = ("readout_node", "reduction", "times_input", "signed", "grad_cam")


@dataclass(frozen=True)
class Edit:
    plan: Plan
    method: str
    readout: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    sampling: tuple | None = field(default=None, compare=False, hash=False)  # (kind, options) of the method


class PlanHistory:
    """A linear undo/redo list of ``Edit``s; recording after an undo drops the redo branch."""

    def __init__(self, first: Edit) -> None:
        self._edits = [first]
        self._index = 0

    @property
    def current(self) -> Edit:
        return self._edits[self._index]

    @property
    def can_undo(self) -> bool:
        return self._index > 0

    @property
    def can_redo(self) -> bool:
        return self._index < len(self._edits) - 1

    def record(self, edit: Edit) -> None:
        del self._edits[self._index + 1 :]
        self._edits.append(edit)
        self._index += 1

    def replace(self, edit: Edit) -> None:
        self._edits[self._index] = edit

    def undo(self) -> Edit:
        if self.can_undo:
            self._index -= 1
        return self.current

    def redo(self) -> Edit:
        if self.can_redo:
            self._index += 1
        return self.current
