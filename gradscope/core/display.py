"""Rich display of results (Jupyter's ``_repr_html_``) and ``.show()`` outside notebooks.

A result of a low layer (a ``TrainingLog`` of core, a ``SanityReport`` of the engine) is drawn by the display code
of ``gradscope.app.display``, which sits above it: the class names its drawing function as ``"module:function"``
and the function is imported when the result is first shown, so importing a result never imports the display, and
the display never becomes a dependency of the layers below it (the rules of ``pyproject.toml``'s import contracts).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, ClassVar


def in_notebook() -> bool:
    """A Jupyter kernel (notebook, lab, Colab, VS Code) runs this process: IPython's kernel app is up. Looked up
    in ``sys.modules`` only: nothing is imported."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def drawing_function(name: str) -> Any:
    """The function ``"package.module:function"`` names."""
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


class RichDisplay:
    """Mixin: a result that shows itself in a notebook and, with ``show()``, in the default browser elsewhere.

    Only HTML: its pictures are PNGs inside it, so a notebook does not store each picture twice (a ``_repr_png_``
    beside it would be saved too)."""

    _html_maker: ClassVar[str] = ""  # "module:function" (result) -> HTML fragment

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # IPython takes the first class of the MRO that defines ``_repr_pretty_`` or ``__repr__``: a dataclass
        # defines ``__repr__`` itself, so the one-line text must be on each class, not only on this mixin
        super().__init_subclass__(**kwargs)
        cls._repr_pretty_ = RichDisplay._repr_pretty_

    def _repr_html_(self) -> str:
        return drawing_function(self._html_maker)(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """The ``text/plain`` IPython stores beside the HTML: one line, not the dataclass's every array (an
        ``Explanation``'s repr was 13 KB, a ``TrainingLog``'s 60 KB, and each notebook kept both)."""
        printer.text(self.summary())

    def summary(self) -> str:
        """What the result is, in one line (its class's name; results say more)."""
        return f"<{type(self).__name__}>"

    def show(self, path: str | Path | None = None) -> Path | None:
        """In a notebook: display it. Elsewhere: write it as a self-contained HTML page (``path``, or a temporary
        file) and open it in the default browser; returns the page's path (None in a notebook)."""
        return drawing_function("gradscope.app.display.notebook:show")(self, path)
