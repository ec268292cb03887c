"""What is differentiated: plain data, no TensorFlow (the engine turns it into a scalar)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from gradscope.core.errors import TargetError
from gradscope.core.numbers import int_or_none, is_whole

TARGET_KINDS = ("class", "token", "neuron", "channel", "loss")


def whole_number(value: object, what: str) -> int | None:
    """``value`` as an int (None stays None): ints, numpy integers, integral floats and digit strings ("3", as
    read from a form or a JSON file); anything else is a TargetError, not a silent truncation of 3.7 to 3."""
    if value is None:
        return None
    if isinstance(value, str):
        number = int_or_none(value)
        if number is not None:
            return number
    elif isinstance(value, bool):
        pass  # True is no class index
    elif isinstance(value, numbers.Integral):  # numpy's too, uint64 exactly
        return int(value)
    elif isinstance(value, numbers.Real):
        number = float(value)
        # past 2**53 a float is not the number the user wrote (1e30 would read as 1000000000000000019884624838656)
        if number.is_integer() and abs(number) <= 2**53:
            return int(number)
    raise TargetError(f"The {what} must be a whole number, not {value!r}.")


@dataclass(frozen=True)
class Target:
    """The scalar whose gradient is taken, summed over the batch (samples stay independent).

    - ``class``: the logit of class ``index`` at the model output (``None``: each sample's top-1). A final
      softmax is skipped, so this is the pre-softmax logit, as RULES_SPEC §1 asks (one-hot seed on logits).
    - ``neuron``: one element ``neuron`` (index without the batch axis) of node ``node``'s output.
    - ``channel``: the sum over all positions of channel ``channel`` (last axis) of node ``node``'s output.
    - ``token``: a causal language model's next token (its output is (batch, sequence, vocabulary)): the logit of
      token ``index`` (``None``: the most likely) at ``position`` (``None``: the last real position, before any
      padding), minus the logit of token ``contrast`` there when given (a contrastive explanation: why A rather
      than B). A ``class`` target on such a model is this target.
    - ``loss``: a training loss (``loss``: "auto", "compiled", "crossentropy", "mse"; see
      ``gradscope.engine.backward.loss_targets``), batch mean, with labels given at run time (``engine.backward(...,
      labels=...)``): labels are data, not part of the target.
    """

    kind: str = "class"
    index: int | None = None
    node: str | None = None
    neuron: tuple[int, ...] | None = None
    channel: int | None = None
    loss: str | None = None
    position: int | None = None
    contrast: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise TargetError(f"Unknown target kind {self.kind!r}; use one of {', '.join(TARGET_KINDS)}.")
        if self.kind == "neuron" and self.neuron is None:
            raise TargetError("A neuron target needs `neuron=(i, j, ...)` (index without the batch axis).")
        if self.kind == "channel" and self.channel is None:
            raise TargetError("A channel target needs `channel=c`.")
        for name in ("index", "channel", "position", "contrast"):
            object.__setattr__(self, name, whole_number(getattr(self, name), f"target {name}"))
        if (self.position is not None or self.contrast is not None) and self.kind not in ("class", "token"):
            raise TargetError("A position or a contrast belongs to a next-token target (kind 'token').")
        if self.neuron is not None:
            try:
                neuron = tuple(whole_number(i, "neuron index") for i in self.neuron)
            except TypeError:
                raise TargetError(f"A neuron index is a tuple of integers, not {self.neuron!r}.") from None
            object.__setattr__(self, "neuron", neuron)

    def check_class(self, classes: int | None) -> None:
        """Raise ``TargetError`` when this class target names a class the model does not have (``classes``: how
        many the output scores, ``LayerGraph.class_count``; None when unknown)."""
        if self.kind == "class" and self.index is not None and classes and not 0 <= self.index < classes:
            raise TargetError(f"Class {self.index} does not exist: the model has {classes} classes.")

    def check_token(self, vocabulary: int | None, length: int | None) -> None:
        """Raise ``TargetError`` for a token or position the language model does not have."""
        for what, value in (("token", self.index), ("contrast token", self.contrast)):
            if value is not None and vocabulary and not 0 <= value < vocabulary:
                raise TargetError(f"The {what} {value} does not exist: the vocabulary has {vocabulary} tokens.")
        if self.position is not None and length is not None and not -length <= self.position < length:
            raise TargetError(f"Position {self.position} does not exist: the input has {length} positions.")
        if self.contrast is not None and self.contrast == self.index:
            raise TargetError("A contrast compares two different tokens; give another one.")

    def as_token(self) -> Target:
        """A class target read as the next-token target of a language model (the same index)."""
        return (
            self
            if self.kind == "token"
            else Target(kind="token", index=self.index, position=self.position, contrast=self.contrast)
        )

    def trace_key(self) -> tuple:
        """The part that changes the traced graph (a class or token index does not: it is fed as a tensor)."""
        return (self.kind, self.node, self.neuron, self.channel, self.loss, self.position, self.contrast)

    def describe(self) -> str:
        if self.kind == "class":
            return "top-1 class logit" if self.index is None else f"logit of class {self.index}"
        if self.kind == "token":
            where = "the last position" if self.position is None else f"position {self.position}"
            what = "the most likely next token" if self.index is None else f"token {self.index}"
            return f"{what} after {where}" + (f", minus token {self.contrast}" if self.contrast is not None else "")
        if self.kind == "loss":
            return f"training loss ({self.loss or 'auto'}{f', output {self.node}' if self.node else ''})"
        if self.kind == "neuron":
            return f"neuron {self.neuron} of {self.node or 'the output'}"
        return f"channel {self.channel} of {self.node or 'the output'}"

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any, *, what: str = "The target") -> Target:
        """A target from parsed JSON, checked against ``core.formats.TargetFile`` (unknown keys, wrong types)."""
        from gradscope.core.formats import TargetFile, decode

        doc = decode(data, TargetFile, what=what, error=TargetError, parsed=True)
        return cls(
            kind=doc.kind,
            index=doc.index,
            node=doc.node,
            neuron=None if doc.neuron is None else tuple(doc.neuron),
            channel=doc.channel,
            loss=doc.loss,
            position=doc.position,
            contrast=doc.contrast,
        )

    @classmethod
    def parse(cls, text: str | None) -> Target:
        """CLI form: ``7`` (class), ``top`` , ``neuron:NODE:i,j,k``, ``channel:NODE:c``, ``loss[:NAME[:OUTPUT]]``."""
        if text is None or text in ("", "top", "top1"):
            return cls()
        if text == "loss" or text.startswith("loss:"):
            name, _, output = text.partition(":")[2].partition(":")
            return cls(kind="loss", loss=name or None, node=output or None)
        if is_whole(text):
            return cls(index=int_or_none(text))
        kind, _, rest = text.partition(":")
        node, _, idx = rest.rpartition(":")
        numbers = [int_or_none(i) for i in idx.split(",")]
        if None not in numbers:
            if kind == "neuron":
                return cls(kind="neuron", node=node or None, neuron=tuple(numbers))  # type: ignore[arg-type]
            if kind == "channel" and len(numbers) == 1:
                return cls(kind="channel", node=node or None, channel=numbers[0])
        raise TargetError(
            f"Cannot read target {text!r}: use a class index (7), 'top', 'neuron:NODE:i,j,c', 'channel:NODE:c' "
            "or 'loss[:crossentropy|mse|compiled]'."
        )


def next_token_summary(
    logits: Any, position: int, token: int, contrast: int | None = None, decode: Any = None
) -> dict[str, Any]:
    """What a next-token explanation explained, as the sidecar and the window say it: the position, the token
    (id, its word through ``decode`` when there is a vocabulary) and its probability (the softmax of the logits
    at that position), and the same of the contrast token."""
    import numpy as np

    row = np.asarray(logits, np.float64).reshape(-1)
    probs = np.exp(row - row.max())
    probs /= probs.sum()

    def entry(t: int) -> dict[str, Any]:
        label = decode([t])[0] if decode is not None else None
        return {"id": int(t), "label": label, "probability": float(probs[t]), "logit": float(row[t])}

    out: dict[str, Any] = {"position": int(position), **entry(token)}
    if contrast is not None:
        out["contrast"] = entry(contrast)
    return out


def describe_next_token(summary: dict[str, Any]) -> str:
    """A ``next_token_summary`` in words, as the CLI prints it and a PNG of the map is headed: "next token 16
    ' mat' (p = 0.31) rather than 46 ' hat' (p = 0.12) after position 5"."""
    from gradscope.core.files import shorten

    def name(t: dict[str, Any]) -> str:
        label = f" {shorten(t['label'], 30)!r}" if t.get("label") else ""
        return f"{t['id']}{label} (p = {t['probability']:.3g})"

    vs = f" rather than {name(summary['contrast'])}" if summary.get("contrast") else ""
    return f"next token {name(summary)}{vs} after position {summary['position']}"
