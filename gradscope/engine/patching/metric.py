"""The metric a patch moves, per sample, from the model's logits: the target's logit (minus a contrast token's: the
usual logit difference), its probability (minus the contrast's), or the loss (cross-entropy of the target). The
token and the position are fixed on the clean input (the most likely next token there, unless given), so every
patched run is measured on the same quantity."""

from __future__ import annotations

import dataclasses
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
    index: int | None  # the token (or class) measured; None: the clean run's most likely (``resolved``)
    contrast: int | None = None
    position: int | None = None  # where a language model's next token is read; None for a classifier

    @classmethod
    def for_target(cls, engine: Any, target: Target, kind: str, xs: list) -> Metric:
        """The metric of ``target`` on the model inputs ``xs``: its position fixed from the inputs (a language model
        reads the last real one), its token as given or left to the clean run (``index`` None)."""
        if kind not in METRICS:
            raise TargetError(f"The metric is one of {', '.join(METRICS)}; got {kind!r}.")
        if kind == "loss" and target.contrast is not None:
            raise TargetError(
                "The loss is the target's cross-entropy: a contrast token belongs to 'logit' or 'probability'."
            )
        if target.kind not in ("class", "token"):
            raise TargetError(f"Patching measures a class or a next token, not a {target.kind} target.")
        shape = engine.graph.node(engine.graph.output_ids[0]).output_shape
        position = None
        if len(shape) == 3:
            target = target.as_token() if target.kind == "class" else target
            position = token_targets.first_position(engine, target, list(xs))
        elif len(shape) != 2:
            raise TargetError(
                f"Patching reads a (batch, classes) or (batch, sequence, vocabulary) output; got {shape}."
            )
        size = shape[-1]
        for what, i in (("target", target.index), ("contrast", target.contrast)):
            if i is not None and size is not None and not 0 <= i < size:
                raise TargetError(f"The {what} {i} does not exist: the output has {size} entries.")
        return cls(kind, target.index, target.contrast, position)

    @classmethod
    def on_clean(cls, engine: Any, target: Target, kind: str, values: dict) -> Metric:
        """The metric of ``target`` with its token (or class) and position fixed on the clean run's ``values``."""
        xs = [values[k] for k in engine.exec.input_keys]
        return cls.for_target(engine, target, kind, xs).resolved(values[engine.logits_key])

    def resolved(self, logits: Any) -> Metric:
        """The metric with its token fixed: the clean run's most likely when none was given (``logits``: clean)."""
        if self.index is not None:
            return self
        at = logits[0] if self.position is None else logits[0, self.position]
        return dataclasses.replace(self, index=int(tf.argmax(at)))

    def of(self, logits: Any, spec: Any = None) -> Any:
        """The metric of each sample of a logits batch (its dtype widened to float32: bfloat16 cannot tell a patch's
        small change). ``spec``: ``self.spec()`` fed as a tensor, so one traced function serves every token,
        contrast and position (the Python values would be baked into the trace); an index of -1 reads each
        sample's most likely (the clean run, before ``resolved``)."""
        spec = self.spec() if spec is None else spec
        index, contrast, position = tf.unstack(spec)
        at = logits if self.position is None else tf.gather(logits, position, axis=1)
        at = tf.cast(at, tf.float32)
        top = tf.argmax(at, axis=-1, output_type=tf.int32)
        index = tf.where(index < 0, top, tf.fill(tf.shape(top), index))

        def pick(values: Any, i: Any) -> Any:
            return tf.gather(values, tf.reshape(i, [-1, 1]), axis=1, batch_dims=1)[:, 0]

        contrasts = tf.fill(tf.shape(top), contrast)
        if self.kind == "logit":
            value = pick(at, index)
            return value if self.contrast is None else value - pick(at, contrasts)
        log_p = tf.nn.log_softmax(at, axis=-1)
        if self.kind == "loss":
            return -pick(log_p, index)
        p = tf.exp(log_p)
        return pick(p, index) if self.contrast is None else pick(p, index) - pick(p, contrasts)

    def spec(self) -> Any:
        """(index, contrast, position) as an int32 tensor (-1 where there is none)."""
        index = -1 if self.index is None else self.index
        return tf.constant([index, -1 if self.contrast is None else self.contrast,
                            -1 if self.position is None else self.position], tf.int32)  # fmt: skip

    @property
    def shape_key(self) -> tuple:
        """What a trace of ``of(..., spec)`` depends on beyond the spec."""
        return (self.kind, self.contrast is None, self.position is None)

    def describe(self, decode: Any = None) -> str:
        name = (lambda i: f"{i} {decode([i])[0]!r}") if decode else str
        if self.position is None:  # a classifier's class
            name = (lambda i: f"class {i}") if not decode else (lambda i: f"class {i} ({decode([i])[0]})")
        what = {"logit": "logit", "probability": "probability", "loss": "cross-entropy"}[self.kind]
        text = f"{what} of {name(self.index)}"
        if self.contrast is not None:
            text += f" - {what} of {name(self.contrast)}"
        return text + (f" after position {self.position}" if self.position is not None else "")
