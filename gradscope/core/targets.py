"""What is differentiated: plain data, no TensorFlow (the engine turns it into a scalar)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gradscope.core.errors import TargetError

TARGET_KINDS = ("class", "neuron", "channel", "loss")


def whole_number(value: object, what: str) -> int | None:
    """``value`` as an int (None stays None): ints, numpy integers, integral floats and digit strings ("3", as
    read from a form or a JSON file); anything else is a TargetError, not a silent truncation of 3.7 to 3."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
    elif not isinstance(value, bool):
        try:
            number = float(value)  # type: ignore[arg-type]
            if number.is_integer():
                return int(number)
        except (TypeError, ValueError, OverflowError):
            pass
    raise TargetError(f"The {what} must be a whole number, not {value!r}.")


@dataclass(frozen=True)
class Target:
    """The scalar whose gradient is taken, summed over the batch (samples stay independent).

    - ``class``: the logit of class ``index`` at the model output (``None``: each sample's top-1). A final
      softmax is skipped, so this is the pre-softmax logit, as RULES_SPEC §1 asks (one-hot seed on logits).
    - ``neuron``: one element ``neuron`` (index without the batch axis) of node ``node``'s output.
    - ``channel``: the sum over all positions of channel ``channel`` (last axis) of node ``node``'s output.
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

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise TargetError(f"Unknown target kind {self.kind!r}; use one of {', '.join(TARGET_KINDS)}.")
        if self.kind == "neuron" and self.neuron is None:
            raise TargetError("A neuron target needs `neuron=(i, j, ...)` (index without the batch axis).")
        if self.kind == "channel" and self.channel is None:
            raise TargetError("A channel target needs `channel=c`.")
        for name in ("index", "channel"):
            object.__setattr__(self, name, whole_number(getattr(self, name), f"target {name}"))
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

    def trace_key(self) -> tuple:
        """The part that changes the traced graph (a class index does not: it is fed as a tensor)."""
        return (self.kind, self.node, self.neuron, self.channel, self.loss)

    def describe(self) -> str:
        if self.kind == "class":
            return "top-1 class logit" if self.index is None else f"logit of class {self.index}"
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
        )

    @classmethod
    def parse(cls, text: str | None) -> Target:
        """CLI form: ``7`` (class), ``top`` , ``neuron:NODE:i,j,k``, ``channel:NODE:c``, ``loss[:NAME[:OUTPUT]]``."""
        if text is None or text in ("", "top", "top1"):
            return cls()
        if text == "loss" or text.startswith("loss:"):
            name, _, output = text.partition(":")[2].partition(":")
            return cls(kind="loss", loss=name or None, node=output or None)
        if text.lstrip("-").isdigit():
            return cls(index=int(text))
        kind, _, rest = text.partition(":")
        node, _, idx = rest.rpartition(":")
        try:
            if kind == "neuron":
                return cls(kind="neuron", node=node or None, neuron=tuple(int(i) for i in idx.split(",")))
            if kind == "channel":
                return cls(kind="channel", node=node or None, channel=int(idx))
        except ValueError:
            pass
        raise TargetError(
            f"Cannot read target {text!r}: use a class index (7), 'top', 'neuron:NODE:i,j,c', 'channel:NODE:c' "
            "or 'loss[:crossentropy|mse|compiled]'."
        )
