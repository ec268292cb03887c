"""A tiny observer: ``Signal`` objects the Session emits and widgets subscribe to (no Qt in core)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Signal:
    """Callbacks called in connection order with the emitted arguments.

    A failing subscriber must not stop the others (one broken panel must not freeze the rest): errors are
    collected and re-raised after every subscriber ran, unless ``on_error`` handles them.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._subscribers: list[Callable[..., Any]] = []
        self.on_error: Callable[[BaseException], None] | None = None

    def connect(self, callback: Callable[..., Any]) -> Callable[..., Any]:
        if callback not in self._subscribers:
            self._subscribers.append(callback)
        return callback

    def disconnect(self, callback: Callable[..., Any]) -> None:
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def emit(self, *args: Any) -> None:
        errors = []
        for callback in list(self._subscribers):
            try:
                callback(*args)
            except Exception as exc:
                errors.append(exc)
        if errors:
            if self.on_error is None:
                raise errors[0]
            for exc in errors:
                self.on_error(exc)

    def __len__(self) -> int:
        return len(self._subscribers)

    def __repr__(self) -> str:
        return f"Signal({self.name!r}, {len(self)} subscribers)"
