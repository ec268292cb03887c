"""The unit of an evaluation's work: a batch of images, its record on disk, and the progress over batches.

Shared by the local run (``gradscope.app.evaluation.run``) and the Ray run (``gradscope.app.evaluation.on_ray``): both
cut the dataset the same way, score a batch with the same function and write the same record, so a run can stop
on one and resume on the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradscope.app.evaluation.scoring import EvalMethod, EvalSettings, evaluate_batch
from gradscope.io.datasets import DataProblem, Sample

Progress = Callable[[int, int, float], None]  # (images done, images in all, seconds left estimated)


@dataclass
class RunState:
    """What a run did: batches computed now, batches found on disk, whether it was stopped."""

    out: Path
    batches: int
    computed: int = 0
    resumed: int = 0
    images_done: int = 0  # images of the batches already on disk when the run started
    stopped: bool = False
    seconds: float = 0.0


def batch_path(out: Path, index: int) -> Path:
    return out / "batches" / f"{index:06d}.json"


class BatchClock:
    """Images done and the time left, from the images computed in this run (resumed ones cost nothing)."""

    def __init__(self, done: int, total: int, progress: Progress | None) -> None:
        self.done, self.total, self.progress = done, total, progress
        self.start, self.now = time.perf_counter(), 0
        if progress is not None:
            progress(done, total, float("nan"))

    def add(self, images: int) -> None:
        self.done += images
        self.now += images
        if self.progress is not None:
            rate = (time.perf_counter() - self.start) / self.now
            self.progress(self.done, self.total, rate * (self.total - self.done))

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start


def pending_batches(keys: list[str], settings: EvalSettings, out: Path) -> tuple[list[list[str]], list[int], RunState]:
    """The dataset cut into batches, the indices of those not on disk yet, and the run's state."""
    chunks = [keys[i : i + settings.batch] for i in range(0, len(keys), settings.batch)]
    todo = [i for i in range(len(chunks)) if not batch_path(out, i).exists()]
    missing = set(todo)
    done = sum(len(chunk) for i, chunk in enumerate(chunks) if i not in missing)
    return chunks, todo, RunState(out, len(chunks), resumed=len(chunks) - len(todo), images_done=done)


def batch_record(
    engine: Any,
    methods: list[EvalMethod],
    settings: EvalSettings,
    index: int,
    keys: list[str],
    loaded: tuple[list[Sample], list[dict]],
    source: Any = None,
) -> dict:
    """What ``OUT/batches/<index>.json`` holds: the batch's keys, a record per readable image (or text), the
    samples that could not be used and why, the seconds each method took."""
    samples, bad = loaded
    if settings.text:
        from gradscope.app.evaluation.text_scoring import evaluate_text_batch

        vocab = source.vocabulary() if hasattr(source, "vocabulary") else None
        records, seconds, unusable = evaluate_text_batch(engine, methods, settings, samples, vocab)
        bad = [*bad, *unusable]
    else:
        records, seconds = evaluate_batch(engine, methods, settings, samples)
    return {"batch": index, "keys": keys, "images": records, "bad": bad, "seconds": seconds}


def load_samples(source: Any, keys: list[str]) -> tuple[list[Sample], list[dict]]:
    """The readable samples of ``keys`` and, for the others, ``{"key", "reason"}``."""
    samples, bad = [], []
    for key in keys:
        try:
            samples.append(source.load(key))
        except DataProblem as exc:
            bad.append({"key": key, "reason": str(exc)})
    return samples, bad
