"""Loss spikes, as people training language models watch for them, from the norms a ``GradientMonitor`` keeps of
every step: a step whose global gradient norm exceeds ``k`` x the running median of the steps before it, with the
layers whose norms rose most; how often a ``clipnorm`` / ``global_clipnorm`` optimizer clipped; the steps a loss
scaler skipped for an overflow."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from gradscope.core.training_log import TrainingLog

#: A spike is measured against the median of this many steps before it (fewer at the start).
WINDOW = 100
#: Steps needed before the first one that can be called a spike.
MIN_HISTORY = 8
#: Layers named per spike.
TOP_LAYERS = 3


@dataclass(frozen=True)
class Spike:
    step: int
    global_norm: float
    median: float  # of the steps before it (up to WINDOW)
    loss: float
    layers: tuple[tuple[str, float], ...]  # (layer, its norm / its own running median), the largest rises first

    @property
    def factor(self) -> float:
        return self.global_norm / self.median if self.median > 0 else math.inf

    def to_dict(self) -> dict:
        return {**asdict(self), "factor": self.factor}


def _layer_names(log: TrainingLog) -> list[str]:
    layer_of = {n.id: n.layer_name or n.id for n in log.nodes}
    return [layer_of.get(w.node or "", w.path.rsplit("/", 1)[0]) for w in log.weights]


def loss_spikes(log: TrainingLog, k: float = 5.0) -> list[Spike]:
    """Every step whose global gradient norm is above ``k`` x the median of the (up to ``WINDOW``) steps before
    it; non-finite steps are the NaN alert's, not spikes, and stay out of the medians."""
    norms = log.norms
    if norms is None or len(norms) <= MIN_HISTORY:
        return []
    layers = _layer_names(log)
    finite = np.isfinite(norms.global_norm)
    spikes = []
    for i in range(MIN_HISTORY, len(norms)):
        if not finite[i]:
            continue
        before = np.flatnonzero(finite[max(0, i - WINDOW) : i]) + max(0, i - WINDOW)
        if len(before) < MIN_HISTORY:
            continue
        median = float(np.median(norms.global_norm[before]))
        if not norms.global_norm[i] > k * median:
            continue
        own = np.median(norms.variables[before], axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rise = np.where(own > 0, norms.variables[i] / own, np.where(norms.variables[i] > 0, np.inf, 0.0))
        by_layer: dict[str, float] = {}
        for layer, r in zip(layers, rise):
            by_layer[layer] = max(by_layer.get(layer, 0.0), float(r))
        top = sorted(by_layer.items(), key=lambda item: -item[1])[:TOP_LAYERS]
        spikes.append(Spike(int(norms.steps[i]), float(norms.global_norm[i]), median, float(norms.loss[i]), tuple(top)))
    return spikes


def clipped_steps(log: TrainingLog) -> tuple[str, list[int]] | None:
    """(what clipped, the steps it clipped) for an optimizer with ``global_clipnorm`` or ``clipnorm`` (each
    variable's gradient on its own); None without either or without per-step norms. ``clipvalue`` clips
    elements, which norms cannot tell."""
    norms = log.norms
    if norms is None:
        return None
    if "global_clipnorm" in log.clipping:
        limit = log.clipping["global_clipnorm"]
        return f"global_clipnorm={limit:g}", [int(s) for s in norms.steps[norms.global_norm > limit]]
    if "clipnorm" in log.clipping:
        limit = log.clipping["clipnorm"]
        clipped = (norms.variables > limit).any(axis=1)
        return f"clipnorm={limit:g}", [int(s) for s in norms.steps[clipped]]
    return None


def _steps_text(steps: list[int], shown: int = 8) -> str:
    text = ", ".join(map(str, steps[:shown]))
    return text + (f", ... {steps[-1]}" if len(steps) > shown else "")


def spike_detail(s: Spike) -> str:
    rose = ", ".join(f"{layer} x{r:.3g}" for layer, r in s.layers)
    return (
        f"global gradient norm {s.global_norm:.4g} = {s.factor:.3g}x the median of the steps before "
        f"({s.median:.4g}); loss {s.loss:.4g}; rose most: {rose}"
    )


def norm_lines(log: TrainingLog) -> list[str]:
    """The report's lines on clipping and on a loss scaler's skipped steps (spikes are alerts)."""
    lines = []
    norms = log.norms
    clipped = clipped_steps(log)
    if clipped is not None and norms is not None:
        what, steps = clipped
        lines.append(
            f"{what} clipped {len(steps)} of {len(norms)} steps" + (f": {_steps_text(steps)}" if steps else "")
        )
    if log.overflows:
        at: dict[int, int] = {}
        for step, _ in log.overflows:
            at[step] = at.get(step, 0) + 1
        where = [f"{step}" + (f" (x{n})" if n > 1 else "") for step, n in at.items()]
        line = (
            f"The loss scaler skipped {len(log.overflows)} update(s) for an overflow (mixed precision; not a NaN "
            f"alert) at optimizer step(s) {', '.join(where[:8])}{', ...' if len(where) > 8 else ''}; the loss "
            f"scale was {log.overflows[-1][1]:g} at the last"
        )
        if norms is not None and len(log.overflows) >= 20 and len(log.overflows) * 2 > len(norms):
            line += "; it skips most updates: a NaN/Inf that no scale removes (look at the gradients in float32)"
        lines.append(line)
    return lines
