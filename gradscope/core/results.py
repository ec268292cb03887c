"""Results of one backward pass, as numpy (safe to hand to any thread, Qt included)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradscope.core.display import RichDisplay

#: Order of the in-graph statistics columns (engine and results agree on it).
STAT_NAMES = ("norm", "mean_abs", "max_abs", "zero_fraction", "nan_count", "inf_count")


def non_finite_input_warnings(inputs: Any) -> list[str]:
    """One line per model input holding NaN or Inf (reported like NaN/Inf weights: the maps and the flow of
    such an input are NaN, and nothing else says why)."""
    inputs = list(inputs)
    out = []
    for i, x in enumerate(inputs):
        x = np.asarray(x)
        if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
            nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
            which = "the input" if len(inputs) == 1 else f"input {i}"
            out.append(
                f"{which} has {nan} NaN and {inf} Inf of {x.size} values: every gradient that depends on them is "
                "NaN (check how the input was made)"
            )
    return out


@dataclass(frozen=True)
class NodeStats:
    """Statistics of the gradient arriving at a node's output (over the whole batch)."""

    norm: float
    mean_abs: float
    max_abs: float
    zero_fraction: float
    nan_count: int
    inf_count: int
    is_none: bool = False  # no gradient reaches this node at all (disconnected / cut)

    @classmethod
    def from_row(cls, row: np.ndarray) -> NodeStats:
        return cls(float(row[0]), float(row[1]), float(row[2]), float(row[3]), int(row[4]), int(row[5]))

    @classmethod
    def none(cls) -> NodeStats:
        return cls(math.nan, math.nan, math.nan, math.nan, 0, 0, is_none=True)

    @property
    def status(self) -> str:
        """'none', 'nan', 'zero' or 'ok': what the graph view colours a node by."""
        if self.is_none:
            return "none"
        if self.nan_count or self.inf_count:
            return "nan"
        if self.max_abs == 0.0:
            return "zero"
        return "ok"


class LazyArrays(Mapping):
    """Node id -> numpy array, copied from the engine's tensors when first read.

    Copying every node's signal and value to numpy cost 1.4x a whole gradient on ResNet50 (350 tensors), while
    a view reads two or three of them; ``materialize()`` copies the rest (the Session does it on its worker,
    after the result is shown). Values that are already arrays are kept as they are.
    """

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._raw = dict(values or {})
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        array = self._arrays.get(key)
        if array is None:
            raw = self._raw[key]
            array = np.asarray(raw.numpy() if hasattr(raw, "numpy") else raw)
            self._arrays[key] = array
        return array

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def materialize(self) -> LazyArrays:
        """Copy every value now (on the thread that may do TensorFlow work)."""
        for key in self._raw:
            self[key]
        return self

    @property
    def pending(self) -> int:
        return len(self._raw) - len(self._arrays)


@dataclass
class BackwardResult(RichDisplay):
    """Signal at the input (and at captured nodes), per-node statistics and the model's real predictions."""

    _html_maker = "gradscope.app.display.reports:backward_result_html"  # in a notebook (gradscope.core.display)

    input_grads: list[np.ndarray]
    node_grads: Mapping[str, np.ndarray]  # backward signal arriving at each captured node's output
    node_values: Mapping[str, np.ndarray]  # forward output of each captured node (for gradient x input)
    stats: dict[str, NodeStats]
    predictions: np.ndarray  # the model's real output (probabilities if it ends in softmax)
    logits: np.ndarray  # what the class target reads (pre-softmax)
    target_indices: np.ndarray  # class index per sample (class targets), else empty
    rules: dict[str, str]  # node id -> rule name actually applied
    inputs: list[np.ndarray] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def input_grad(self) -> np.ndarray:
        return self.input_grads[0]

    def warnings(self) -> list[str]:
        """What makes this result misleading whatever the map: selectors that matched no node, NaN/Inf weights
        (``meta["weight_problems"]``, from the engine) and NaN/Inf outputs."""
        out = [f"selector {s!r} matched no node: its rule is not applied" for s in self.unmatched]
        out += non_finite_input_warnings(self.inputs or ())
        out += list(self.meta.get("weight_problems", ()))
        logits = np.asarray(self.logits)
        if logits.size and not np.isfinite(logits).all():
            out.append("the model's outputs are NaN/Inf for this input (check its weights): the class is meaningless")
        return out

    def signal(self, node_id: str | None = None) -> np.ndarray:
        """The backward signal at ``node_id``'s output (None: the first model input)."""
        if node_id is None:
            return self.input_grads[0]
        try:
            return self.node_grads[node_id]
        except KeyError:
            from gradscope.core.errors import GraphError

            raise GraphError(
                f"The signal at {node_id!r} was not captured in this run; pass capture=[{node_id!r}]."
            ) from None

    def flow_table(self) -> list[dict[str, Any]]:
        """One row per node in graph order: what the gradient-flow plot and its CSV show."""
        rows = []
        for node_id, s in self.stats.items():
            rows.append(
                {
                    "node": node_id,
                    "rule": self.rules.get(node_id, ""),
                    "status": s.status,
                    "norm": s.norm,
                    "mean_abs": s.mean_abs,
                    "max_abs": s.max_abs,
                    "zero_fraction": s.zero_fraction,
                    "nan_count": s.nan_count,
                    "inf_count": s.inf_count,
                }
            )
        return rows
