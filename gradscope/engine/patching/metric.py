"""The metric a patch moves, per sample, from the model's logits: the target's logit (minus a contrast token's: the
usual logit difference), its probability (minus the contrast's), or the loss (cross-entropy of the target). The
token and the position are fixed on the clean input (the most likely next token there, unless given), so every
patched run is measured on the same quantity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradscope.backend import tf
from gradscope.core.errors import TargetError
from gradscope.core.targets import Target
from gradscope.engine.backward import token_targets

METRICS = ("logit", "probability", "loss")


@dataclass(frozen=True)
class Metric:
    kind: str  # one of METRICS
    index: int  # the token (or class) measured
    contrast: int | None = None
    position: int | None = None  # where a language model's next token is read; None for a classifier

    @classmethod
    def on_clean(cls, engine: Any, target: Target, kind: str, values: dict) -> Metric:
        """The metric of ``target`` with its token (or class) and position fixed on the clean run's ``values``."""
        if kind not in METRICS:
            raise TargetError(f"The metric is one of {', '.join(METRICS)}; got {kind!r}.")
        if kind == "loss" and target.contrast is not None:
            raise TargetError(
                "The loss is the target's cross-entropy: a contrast token belongs to 'logit' or 'probability'."
            )
        if target.kind not in ("class", "token"):
            raise TargetError(f"Patching measures a class or a next token, not a {target.kind} target.")
        logits = values[engine.logits_key]
        position = None
        if logits.shape.rank == 3:
            target = target.as_token() if target.kind == "class" else target
            position = int(token_targets.positions(engine, target, values, logits)[0])
            logits = logits[:, position]
        elif logits.shape.rank != 2:
            raise TargetError(
                f"Patching reads a (batch, classes) or (batch, sequence, vocabulary) output; got {logits.shape}."
            )
        index = target.index if target.index is not None else int(tf.argmax(logits[0]))
        size = int(logits.shape[-1])
        for what, i in (("target", index), ("contrast", target.contrast)):
            if i is not None and not 0 <= i < size:
                raise TargetError(f"The {what} {i} does not exist: the output has {size} entries.")
        return cls(kind, int(index), target.contrast, position)

    def of(self, logits: Any) -> Any:
        """The metric of each sample of a logits batch (its dtype widened to float32: bfloat16 cannot tell a patch's
        small change)."""
        at = tf.cast(logits if self.position is None else logits[:, self.position], tf.float32)
        if self.kind == "logit":
            value = at[:, self.index]
            return value if self.contrast is None else value - at[:, self.contrast]
        log_p = tf.nn.log_softmax(at, axis=-1)
        if self.kind == "loss":
            return -log_p[:, self.index]
        p = tf.exp(log_p)
        return p[:, self.index] if self.contrast is None else p[:, self.index] - p[:, self.contrast]

    def describe(self, decode: Any = None) -> str:
        name = (lambda i: f"{i} {decode([i])[0]!r}") if decode else str
        if self.position is None:  # a classifier's class
            name = (lambda i: f"class {i}") if not decode else (lambda i: f"class {i} ({decode([i])[0]})")
        what = {"logit": "logit", "probability": "probability", "loss": "cross-entropy"}[self.kind]
        text = f"{what} of {name(self.index)}"
        if self.contrast is not None:
            text += f" - {what} of {name(self.contrast)}"
        return text + (f" after position {self.position}" if self.position is not None else "")
