"""What the user is told, as a small evented model: status lines and errors. Every other model reports through
one ``Feedback``, so the window has one status bar and one place where errors turn into dialogs (or, headless,
into stderr and the exit code).

Owns nothing but its two events.
Emits: ``status_changed(message)``; ``error_raised(title, message, exception or None)``.
"""

from __future__ import annotations

from gradscope.core.events import Signal


class Feedback:
    def __init__(self) -> None:
        self.status_changed = Signal("status_changed")  # (message)
        self.error_raised = Signal("error_raised")  # (title, message, exception or None)

    def say(self, message: str) -> None:
        self.status_changed.emit(message)

    def error(self, title: str, message: str, exc: BaseException | None = None) -> None:
        self.error_raised.emit(title, message, exc)
