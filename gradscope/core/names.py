"""Names of a layer's weights, as rules, the inspector and plans address them (no TensorFlow needed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def weight_names(owner: Any, variables: Sequence[Any]) -> list[str]:
    """Each variable's path relative to the layer that owns it: ``kernel`` for a Dense, ``query/kernel`` and
    ``key/kernel`` for a MultiHeadAttention (its last names alone would collide), ``cell/kernel`` for an LSTM.
    Names still equal after that get ``#1``, ``#2``, so a rule can address every weight."""
    prefix = (getattr(owner, "path", None) or getattr(owner, "name", "") or "") + "/"
    names = []
    for v in variables:
        path = (getattr(v, "path", None) or v.name).split(":")[0]
        names.append(path[len(prefix) :] if path.startswith(prefix) else path.split("/")[-1])
    seen: dict[str, int] = {}
    unique = []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        unique.append(n if k == 0 else f"{n}#{k}")
    return unique
