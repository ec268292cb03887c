"""What the model is fed, as a small evented model: an image with its pixel scaling, or another input (a file of
token ids, arrays or a CSV row; token ids or words typed by the user, with an optional vocabulary), and the
batch built from it for the open model's inputs. Plain numpy and Pillow: no TensorFlow, no Qt.

Owns: ``image`` (uint8 RGB) and ``image_path``, ``preprocessing``; ``source`` (a non-image input file) or
``typed`` (what the user typed); ``vocab``; ``batch`` (the model's input arrays), ``fed`` (the checked non-image
input: tokens and their words, feature names), ``note`` (why the batch is what it is, e.g. padding or a random
input), ``problem`` (why the chosen input could not be used) and ``version`` (bumped with every new batch: a
baseline computed for an older batch is stale).
Emits: ``changed()`` when what is fed changes (the composition prepares the batch and runs); ``image_changed``
(image or None) for the views that show the image. Unreadable input is refused through ``Feedback.error``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gradscope.app.models.feedback import Feedback
from gradscope.app.rendering.view import PREPROCESSINGS
from gradscope.core.errors import InputError
from gradscope.core.events import Signal
from gradscope.core.graph import LayerGraph
from gradscope.io.model_inputs import INPUT_FILE_SUFFIXES, ModelInput, read_model_input, token_input, typed_input
from gradscope.io.sequences import Vocabulary, is_hub_tokenizer


class Inputs:
    def __init__(self, feedback: Feedback, submit: Any = None) -> None:
        self._feedback = feedback
        self._submit = submit  # ``Jobs.submit``: a keras_hub tokenizer loads on the worker (it imports TensorFlow)
        self.loading_vocab = False  # a tokenizer is loading: the input waits for it
        self.image: np.ndarray | None = None
        self.image_path: str | None = None
        self.preprocessing = "unit"
        self.source: str | None = None
        self.typed: str | None = None
        self._graph: LayerGraph | None = None  # the model the last batch was prepared for
        self.vocab: Vocabulary | None = None
        self.batch: Any = None  # one array, or a list of arrays for a multi-input model
        self.fed: ModelInput | None = None
        self.note = ""
        self.problem = ""
        self.version = 0
        self.changed = Signal("input_changed")  # ()
        self.image_changed = Signal("image_changed")  # (image or None)

    @property
    def labels(self) -> tuple[str, ...]:
        """What each position of a per-position map is (tokens, feature names); empty for images."""
        return self.fed.labels if self.fed is not None else ()

    @property
    def described(self) -> str | None:
        """The input in a word for titles and sidecars: the file, or what was typed."""
        return self.image_path or self.source or (f"<typed: {self.typed}>" if self.typed else None)

    # ------------------------------------------------------------------------------------------- changes
    def open(self, path: str | Path) -> bool:
        """Use the file at ``path``: an image, or (by its suffix) arrays, a CSV row or token ids, read when the
        batch is prepared for the open model. False, and why, when it cannot be."""
        p = Path(path).expanduser()
        if p.suffix.lower() in INPUT_FILE_SUFFIXES:  # anything else is an image to Pillow
            if not p.is_file():
                self._feedback.error("Cannot open the input", f"Input file not found: {p}")
                return False
            self._take(source=str(p))
            return True
        from gradscope.io.images import load_image

        try:
            image = load_image(p)
        except InputError as exc:
            self._feedback.error("Cannot open the image", str(exc), exc)
            return False
        return self.set_image(image, str(path))

    def set_image(self, image: Any, path: str | None = None) -> bool:
        """Make ``image`` (any array Pillow can show as RGB) current. False, and why, when it cannot be."""
        from gradscope.io.images import rgb_image

        try:
            rgb = rgb_image(image)
        except InputError as exc:
            self._feedback.error("Cannot use the image", str(exc), exc)
            return False
        self._take(image=rgb, image_path=path)
        return True

    def set_typed(self, text: str) -> bool:
        """Use token ids ("12 7 99") or, with a vocabulary, words the user typed."""
        if not text.strip():
            self._feedback.error("No input", "Type token ids such as 12 7 99, or words when a vocabulary is loaded.")
            return False
        # refused now, the last good input stays (it was replaced by a random one); while a tokenizer loads the
        # words wait for it and are checked when it is there (a refusal then says why)
        if self._graph is not None and not self.loading_vocab:
            try:
                typed_input(self._graph, text, self.vocab)
            except InputError as exc:
                self._feedback.error("Input refused", f"{exc} The input shown is unchanged.", exc)
                return False
        self._take(typed=text)
        return True

    def set_vocabulary(self, path: str | Path | None) -> bool:
        """Read token ids as words with the vocabulary file at ``path`` (None: show ids), or split text with the
        keras_hub tokenizer of a preset folder (loaded on the worker; ``loading_vocab`` meanwhile)."""
        if path is not None and is_hub_tokenizer(path) and self._submit is not None:

            def done(vocab: Vocabulary) -> None:
                self.loading_vocab, self.vocab = False, vocab
                self.changed.emit()

            def failed(_exc: BaseException) -> None:
                self.loading_vocab = False  # the job says why; the input goes on without it
                self.changed.emit()

            self.loading_vocab = True
            self._submit(
                "vocab",
                f"Loading the tokenizer in {Path(path).name}...",
                lambda token: Vocabulary.load(path),
                done,
                on_failed=failed,
            )
            return True
        try:
            vocab = Vocabulary.load(path) if path is not None else None
        except InputError as exc:
            self._feedback.error("Cannot read the vocabulary", str(exc), exc)
            return False
        self.vocab = vocab
        self.changed.emit()
        return True

    def set_preprocessing(self, mode: str) -> bool:
        """Change the pixel scaling; False when it is unknown (told) or already ``mode``."""
        if mode not in PREPROCESSINGS:
            self._feedback.error("Unknown preprocessing", f"Choose one of {', '.join(PREPROCESSINGS)}.")
            return False
        if mode == self.preprocessing:
            return False
        self.preprocessing = mode
        self.changed.emit()
        return True

    def _take(
        self, *, image: Any = None, image_path: str | None = None, source: str | None = None, typed: str | None = None
    ) -> None:
        had_image = self.image is not None
        self.image, self.image_path, self.source, self.typed = image, image_path, source, typed
        if image is not None or had_image:
            self.image_changed.emit(self.image)
        self.changed.emit()

    # ------------------------------------------------------------------------------------------- the batch
    def prepare(self, graph: LayerGraph) -> None:
        """The batch for ``graph``'s inputs: the chosen input, checked against the model; an image, scaled, when
        the model takes one image; else a seeded random batch, so the gradient flow of any model can still be
        inspected (``problem`` says why the chosen input was not used)."""
        self._graph = graph
        shapes = [graph.node(i).output_shape for i in graph.input_ids]
        self.note, self.problem, self.fed = "", "", None
        self.version += 1
        if self.source is not None or self.typed is not None:
            try:
                fed = (
                    read_model_input(graph, self.source, vocab=self.vocab)
                    if self.source is not None
                    else typed_input(graph, self.typed or "", self.vocab)
                )
            except InputError as exc:
                self.problem = str(exc)
            else:
                self.fed, self.note = fed, fed.note
                self.batch = fed.arrays[0] if len(fed.arrays) == 1 else list(fed.arrays)
                return
        elif self.image is not None and len(shapes) == 1:
            from gradscope.io.images import prepare_input

            try:
                self.batch = prepare_input(self.image, shapes[0], self.preprocessing)
                return
            except InputError as exc:
                self.note = str(exc)
        rng = np.random.default_rng(0)
        if graph.token_input is not None:  # random ids the embedding has
            ids = rng.integers(0, graph.vocabulary_size(graph.token_input) or 2, shapes[0][1] or 8)
            self.fed = token_input(graph, ids, vocab=self.vocab, source="<random>")
            self.batch = self.fed.arrays[0] if len(self.fed.arrays) == 1 else list(self.fed.arrays)
            self.note = "Random token ids (seed 0): File ▸ Type tokens… to explain your own."
            return
        batch = []
        for node_id, s in zip(graph.input_ids, shapes):
            shape = [1] + [d or 8 for d in s[1:]]
            integer = graph.is_integer_input(node_id)  # ids 0 and 1: every vocabulary has them
            batch.append(rng.integers(0, 2, shape) if integer else rng.standard_normal(shape).astype(np.float32))
        self.batch = batch[0] if len(batch) == 1 else batch
        self.note = f"{self.note} Using a random input (seed 0)." if self.note else "Using a random input (seed 0)."
