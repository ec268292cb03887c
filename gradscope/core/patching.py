"""Patching effects as plain data (``engine.patching`` computes them): for each component (the residual stream after
each block, each attention output, each MLP output, a query or key, or nodes the user picked), the change of a
metric when that node's value at one position (a token, or a grid cell of an image) is replaced by its value on a
corrupted input, measured (``exact``) or estimated (``atp``, ``atp_star``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.display import RichDisplay

METHODS = ("exact", "atp", "atp_star")


@dataclass
class Agreement:
    """How an estimate agrees with the exact effects of the same cells (RULES_SPEC §10: an estimate, never a
    substitute): Pearson correlation, the overlap of the top-k cells by magnitude, and the cells whose sign it
    gets wrong (among those whose exact effect is at least 1 % of the largest)."""

    correlation: float
    top_k: int
    top_k_overlap: float
    wrong_sign: list[tuple[int, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "correlation": self.correlation,
            "top_k": self.top_k,
            "top_k_overlap": self.top_k_overlap,
            "wrong_sign": [list(c) for c in self.wrong_sign],
        }


@dataclass
class PatchResult(RichDisplay):
    """``by_component[c][b, u]``: the metric's change when component ``c`` of block ``b`` (``nodes[c][b]``) takes
    its corrupted value at unit ``u`` (``units[u]``: a token position, or a grid cell ``"row,col"``). ``atp_star``
    gives magnitudes (the paper's |effect| after GradDrop), ``signed`` False then."""

    method: str
    metric: str  # in words: "logit of 12 - logit of 40 after position 7"
    clean_value: float
    corrupt_value: float
    by_component: dict[str, np.ndarray]
    nodes: dict[str, list[str]]
    units: list[str]
    signed: bool = True
    grid: tuple[int, int] | None = None  # an image's cells (rows, columns); None for tokens
    agreement: dict[str, Agreement] = field(default_factory=dict)  # vs exact, when it was computed too
    exact: dict[str, np.ndarray] = field(default_factory=dict)  # the exact effects compared against, if any
    seconds: float = 0.0
    sidecar: dict[str, Any] = field(default_factory=dict)

    _html_maker = "gradscope.app.display.patching:patch_html"  # in a notebook (gradscope.core.display)
    _writer = "gradscope.app.files.patches:write_patch_result"  # named, as the display is: core imports no app

    def summary(self) -> str:
        shapes = ", ".join(f"{c} {e.shape}" for c, e in self.by_component.items())
        return f"<PatchResult: {self.method}, {self.metric}; {shapes}>"

    def save(self, path: str | Path, *, inputs: Any = ()) -> Path:
        """The heat map as PNG, the effects as ``<name>_effects.csv`` and the JSON sidecar, written together."""
        import importlib

        module, name = self._writer.split(":")
        return getattr(importlib.import_module(module), name)(self, path, inputs=inputs)

    @property
    def effects(self) -> np.ndarray | dict[str, np.ndarray]:
        """(blocks, units) for one component; a dict by component when there are several."""
        if len(self.by_component) == 1:
            return next(iter(self.by_component.values()))
        return dict(self.by_component)

    @property
    def components(self) -> list[str]:
        return list(self.by_component)

    def total_change(self) -> float:
        """metric(corrupt) - metric(clean): what patching everything would give."""
        return self.corrupt_value - self.clean_value

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "metric": self.metric,
            "clean_value": self.clean_value,
            "corrupt_value": self.corrupt_value,
            "signed": self.signed,
            "units": list(self.units),
            "grid": list(self.grid) if self.grid else None,
            "nodes": {c: list(n) for c, n in self.nodes.items()},
            "effects": {c: e.tolist() for c, e in self.by_component.items()},
            "agreement": {c: a.to_dict() for c, a in self.agreement.items()},
            "seconds": self.seconds,
        }


def agreement(estimate: np.ndarray, exact: np.ndarray, *, signed: bool = True, top_k: int = 10) -> Agreement:
    """``estimate`` against ``exact`` over the same cells (magnitudes against |exact| when not ``signed``)."""
    want = exact if signed else np.abs(exact)
    a, b = estimate.ravel().astype(np.float64), want.ravel().astype(np.float64)
    correlation = float(np.corrcoef(a, b)[0, 1]) if a.size > 1 and a.std() > 0 and b.std() > 0 else float("nan")
    k = min(top_k, a.size)
    top_a = set(np.argsort(-np.abs(a))[:k].tolist())
    top_b = set(np.argsort(-np.abs(b))[:k].tolist())
    wrong: list[tuple[int, int]] = []
    if signed:
        big = np.abs(exact) >= 0.01 * max(float(np.abs(exact).max()), 1e-30)
        flipped = big & (np.sign(estimate) != np.sign(exact))
        wrong = [(int(i), int(j)) for i, j in zip(*np.nonzero(flipped))]
    return Agreement(correlation, k, len(top_a & top_b) / k if k else float("nan"), wrong)
