"""Patching effects in a notebook (``PatchResult._repr_html_``) and in ``gradscope report``: the heat map the export
writes (the same picture), the clean and corrupted values, and the estimate's agreement with the exact effects."""

from __future__ import annotations

from typing import Any

from gradscope.app.display.html import figure, fragment, table
from gradscope.app.files.patches import patch_picture, patch_title


def patch_body(result: Any) -> str:
    parts = [figure(patch_picture(result), patch_title(result), chart=True)]
    if not result.signed:
        parts.append(
            "<div class='note'>AtP* gives magnitudes (GradDrop's (1/(L-1)) Σ|estimate|): how much each cell matters, "
            "not which way.</div>"
        )
    if result.agreement:
        rows = [
            (c, f"{a.correlation:.3f}", f"{a.top_k_overlap:.0%} of {a.top_k}", len(a.wrong_sign))
            for c, a in result.agreement.items()
        ]
        parts.append(table([f"{result.method} vs exact", "correlation", "top-k overlap", "cells of wrong sign"], rows))
    return "".join(parts)


def patch_html(result: Any) -> str:
    return fragment(patch_body(result))
