"""How the map is read out and drawn, as a small evented model around ``ViewSettings`` (``app.rendering.view``).

Owns: ``settings`` (a ``ViewSettings``, replaced, never changed in place).
Emits: ``changed(settings)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gradscope.app.models.document import ModelDocument
from gradscope.app.rendering.view import INPUT_KEY, SIGNED_DEFAULT, ViewError, ViewSettings
from gradscope.core.events import Signal


class Viewing:
    def __init__(self, document: ModelDocument) -> None:
        self._document = document
        self.settings = ViewSettings()
        self.changed = Signal("view_changed")  # (ViewSettings)

    def set(self, **changes: Any) -> bool:
        """Change some settings (``ViewError`` for an unknown one or a value no picture can be drawn with, a
        read-out node the open model lacks); emits ``changed`` and returns True when something changed."""
        if self.set_quiet(**changes):
            self.changed.emit(self.settings)
            return True
        return False

    def set_quiet(self, **changes: Any) -> bool:
        """``set`` without the event (the caller emits it once after several steps)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(ViewSettings)})
        if unknown:
            raise ViewError(
                f"Unknown view setting(s) {', '.join(unknown)}; valid: {', '.join(ViewSettings().to_dict())}."
            )
        new = dataclasses.replace(self.settings, **changes)
        new.check()  # a bad value is refused here, not at the next export
        readout, graph = new.readout_node, self._document.graph
        if readout not in (None, INPUT_KEY) and (graph is None or readout not in graph):
            raise ViewError(f"Cannot read the map at {readout!r}: no such node in this model.")
        if new == self.settings:
            return False
        self.settings = new
        return True

    def take_readout(
        self, reduction: str, times_input: bool, signed: bool, node: str | None, *, grad_cam: bool = False
    ) -> None:
        """A method's read-out, quietly: its node (else the model input, never a node an earlier preset pinned),
        its reduction and sign; a signed map gets a diverging colormap, and loses it again after."""
        changes: dict[str, Any] = {
            "reduction": reduction,
            "times_input": times_input,
            "signed": signed,
            "readout_node": node or INPUT_KEY,
            "grad_cam": grad_cam,
        }
        if signed:
            changes.update(colormap="bwr", normalization=SIGNED_DEFAULT)
        elif self.settings.signed:
            changes.update(colormap="jet", normalization="minmax")
        self.set_quiet(**changes)

    def restore_readout(self, readout: dict[str, Any]) -> None:
        """Give back the read-out an undo step recorded (colours follow the sign, as presets set them)."""
        changes = dict(readout)
        if changes.get("signed") != self.settings.signed:
            if changes.get("signed"):
                changes.update(colormap="bwr", normalization=SIGNED_DEFAULT)
            else:
                changes.update(colormap="jet", normalization="minmax")
        self.set(**changes)

    def reset(self, settings: ViewSettings) -> None:
        """Quietly replace the settings (a new model or a restored session)."""
        self.settings = settings
