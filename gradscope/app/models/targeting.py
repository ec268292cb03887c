"""What is explained, as a small evented model: the target (a class, the predicted one, a neuron or channel).

Owns: ``target`` (``core.targets.Target``).
Emits: ``changed(target)``; a target the model cannot have is refused through ``Feedback.error``.
"""

from __future__ import annotations

from gradscope.app.models.document import ModelDocument
from gradscope.app.models.feedback import Feedback
from gradscope.core.errors import TargetError
from gradscope.core.events import Signal
from gradscope.core.targets import Target


class Targeting:
    def __init__(self, document: ModelDocument, feedback: Feedback) -> None:
        self._document = document
        self._feedback = feedback
        self.target = Target()
        self.changed = Signal("target_changed")  # (target)

    def set(self, target: Target) -> bool:
        """Make ``target`` current; False (and the reason told) when it is the same or the model has no such
        class."""
        if target == self.target:
            return False
        graph = self._document.graph
        try:
            target.check_class(graph.class_count() if graph is not None else None)
        except TargetError as exc:
            self._feedback.error("Bad target", str(exc), exc)
            return False
        self.target = target
        self.changed.emit(target)
        return True

    def set_class(self, index: int | None) -> bool:
        """Explain class ``index`` (None: the predicted class)."""
        try:
            target = Target(index=index)
        except TargetError as exc:
            self._feedback.error("Bad target", str(exc), exc)
            return False
        return self.set(target)

    def set_token(self, index: int | None, *, contrast: int | None = None, position: int | None = None) -> bool:
        """A language model's next token: ``index`` (None: the most likely) at ``position`` (None: the last),
        rather than ``contrast`` when given."""
        try:
            target = Target(kind="token", index=index, contrast=contrast, position=position)
        except TargetError as exc:
            self._feedback.error("Bad target", str(exc), exc)
            return False
        return self.set(target)

    def reset(self, target: Target | None = None) -> None:
        """Quietly back to ``target`` (default: the predicted class) for a new model."""
        self.target = target if target is not None else Target()
