"""Where a result is shown: in a running Jupyter kernel through IPython's display, elsewhere as an HTML page.

IPython is imported only here and only when a kernel is running (``in_notebook``): it is the optional extra
``gradscope[notebook]``, never needed to compute or save anything.
"""

from __future__ import annotations

import os
import tempfile
import webbrowser
from pathlib import Path
from typing import Any

from gradscope.core.display import in_notebook
from gradscope.core.files import write_text_atomic


def page_of(result: Any) -> str:
    """A result's display as a whole page (``show()`` outside a notebook)."""
    from gradscope.app.display.html import page
    from gradscope.app.display.provenance import versions

    return page(type(result).__name__, result._repr_html_(), versions())


def show(result: Any, path: str | Path | None = None) -> Path | None:
    if path is None and in_notebook():
        from IPython.display import display

        display(result)
        return None
    if path is None:
        handle, path = tempfile.mkstemp(prefix="gradscope-", suffix=".html")
        os.close(handle)  # written over atomically below
    target = write_text_atomic(Path(path), page_of(result))
    opened = False
    try:
        opened = webbrowser.open(target.resolve().as_uri())
    except Exception:  # noqa: BLE001 - no browser is no error: the page is written
        opened = False
    print(f"{'opened' if opened else 'wrote'} {target}")
    return target


class LiveDisplay:
    """One output updated in place: IPython's display handle in a kernel, nothing elsewhere."""

    def __init__(self) -> None:
        self._handle = None
        if in_notebook():
            from IPython.display import HTML, display

            self._html = HTML
            self._handle = display(HTML("<i>gradscope: waiting for the first record…</i>"), display_id=True)

    @property
    def active(self) -> bool:
        return self._handle is not None

    def update(self, html_text: str) -> None:
        if self._handle is not None:
            self._handle.update(self._html(html_text))
