"""Evaluation data of text: a JSONL file, a folder of ``.txt`` files, or a CSV with a text column.

- JSONL: one sample a line, ``{"text": "..."}`` or ``{"ids": [12, 7, 99]}``, with an optional ``"target"`` (a
  token as the vocabulary writes it, or an id: a language model's next token, a classifier's class; default the
  model's own top one), an optional ``"rationale"`` (token positions a person marked, counted in the sequence as
  fed: with the tokenizer's start token) and an optional ``"id"`` (the sample's name; default ``line N``).
- A folder: each ``*.txt`` file is one text, named by its file name.
- CSV: the column ``text`` (or the first column) holds the text; ``target`` and ``id`` columns as in JSONL.

The text is split by the model's vocabulary (its tokenizer in a checkpoint folder) when a sample is loaded. Every
problem with one sample (no text, an id beyond the vocabulary, a target that is not one token) is a
``DataProblem`` naming it: the evaluation lists it and goes on.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import GradscopeError, InputError
from gradscope.core.files import shorten
from gradscope.io.datasets import DataProblem

TEXT_SUFFIXES = (".jsonl", ".csv")
MAX_TEXT_CHARS = 1_000_000  # one sample's text: a line of a 1 GB file is not a prompt


@dataclass
class TextSample:
    key: str
    ids: np.ndarray  # int64 (n,): the tokens as fed, the tokenizer's start/end tokens included
    target: int | None = None  # the token (or class) to explain; None: the model's top one
    rationale: list[int] | None = None  # positions a person marked (token pointing)


def is_text_dataset(path: str | Path, reads_tokens: bool) -> bool:
    """A JSONL or CSV file, or any folder given to a model that reads token ids (``reads_tokens``): a folder of
    images with a README.txt stays an image folder for an image model."""
    p = Path(path).expanduser()
    if p.is_file():
        return p.suffix.lower() in TEXT_SUFFIXES
    return p.is_dir() and reads_tokens


class TextDataset:
    """The samples of a text dataset by key (``keys()``, ``load(key)``, ``describe()``), split by ``vocab`` (a
    ``Vocabulary``; a Ray worker loads it again from its file)."""

    def __init__(self, path: str | Path, vocab: Any = None) -> None:
        self.path = Path(path).expanduser()
        self.vocab = vocab
        self._vocab_source = getattr(vocab, "source", None)
        self._rows = self._read()
        if not self._rows:
            raise GradscopeError(f"The dataset {self.path} holds no samples.")

    def __getstate__(self) -> dict:  # a tokenizer does not travel to a Ray worker: its folder does
        state = dict(self.__dict__)
        state["vocab"] = None
        return state

    def keys(self) -> list[str]:
        return list(self._rows)

    def describe(self) -> dict:
        return {"text": str(self.path), "vocabulary": self._vocab_source, "samples": len(self._rows)}

    def load(self, key: str) -> TextSample:
        row = self._rows[key]
        ids, text = row.get("ids"), row.get("text")
        try:
            if ids is not None:
                if not isinstance(ids, list) or not ids or not all(_whole(i) and i >= 0 for i in ids):
                    raise InputError("'ids' must be a non-empty list of token ids (whole numbers >= 0).")
                encoded = np.asarray(ids, np.int64)
            elif isinstance(text, str) and text.strip():
                if len(text) > MAX_TEXT_CHARS:
                    raise InputError(f"the text has {len(text):,} characters; at most {MAX_TEXT_CHARS:,}.")
                encoded = self._vocabulary(text).encode(text)
            else:
                raise InputError("no text: give 'text' (words) or 'ids' (token ids).")
            target = self._target(row.get("target"))
            rationale = row.get("rationale")
            if rationale is not None and (
                not isinstance(rationale, list) or not all(_whole(i) and 0 <= i < len(encoded) for i in rationale)
            ):
                raise InputError(f"'rationale' must list token positions 0 to {len(encoded) - 1}.")
        except InputError as exc:
            raise DataProblem(str(exc)) from None
        return TextSample(key, encoded, target, rationale)

    def vocabulary(self) -> Any:
        """The vocabulary that reads the texts (loaded from its file in a Ray worker), or None."""
        if self.vocab is None and self._vocab_source is not None:
            from gradscope.io.sequences import Vocabulary

            self.vocab = Vocabulary.load(self._vocab_source)
        return self.vocab

    # ------------------------------------------------------------------------------------------- reading
    def _vocabulary(self, what: str) -> Any:
        if self.vocabulary() is None:
            raise InputError(
                f"{shorten(what)!r} is text, and no vocabulary reads it: give one (--vocab), or 'ids' per sample."
            )
        return self.vocab

    def _target(self, target: Any) -> int | None:
        if target is None:
            return None
        if _whole(target) and target >= 0:
            return int(target)
        if isinstance(target, str) and target.strip():
            return int(self._vocabulary(target).token_id(target))
        raise InputError(f"'target' must be a token or a token id; got {shorten(repr(target))}.")

    def _read(self) -> dict[str, dict]:
        p = self.path
        if p.is_dir():
            return {f.name: {"text": _read_text(f)} for f in sorted(p.glob("*.txt"))}
        if not p.is_file():
            raise GradscopeError(f"The dataset {p} does not exist.")
        if p.suffix.lower() == ".jsonl":
            return self._jsonl(_read_text(p))
        if p.suffix.lower() == ".csv":
            return self._csv(_read_text(p))
        raise GradscopeError(f"{p.name}: a text dataset is a .jsonl or .csv file, or a folder of .txt files.")

    def _jsonl(self, content: str) -> dict[str, dict]:
        rows: dict[str, dict] = {}
        for n, line in enumerate(content.splitlines(), 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as exc:
                raise GradscopeError(f"{self.path.name} line {n} is not JSON ({exc.msg}).") from None
            if not isinstance(doc, dict):
                raise GradscopeError(f'{self.path.name} line {n}: a sample is a JSON object, such as {{"text": ...}}.')
            self._add(rows, str(doc.get("id", f"line {n}")), doc, f"line {n}")
        return rows

    def _csv(self, content: str) -> dict[str, dict]:
        reader = csv.DictReader(io.StringIO(content, newline=""))
        columns = reader.fieldnames or []
        if not columns:
            raise GradscopeError(f"{self.path.name} has no header row (a 'text' column).")
        text_column = "text" if "text" in columns else columns[0]
        rows: dict[str, dict] = {}
        for n, row in enumerate(reader, 1):
            doc: dict[str, Any] = {"text": row.get(text_column) or ""}
            target = (row.get("target") or "").strip()
            if target:
                doc["target"] = int(target) if target.isdigit() else target
            self._add(rows, str(row.get("id") or f"row {n}"), doc, f"row {n}")
        return rows

    def _add(self, rows: dict, key: str, doc: dict, where: str) -> None:
        if key in rows:
            raise GradscopeError(f"{self.path.name} {where}: the id {shorten(key)!r} is given twice.")
        rows[key] = doc


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise GradscopeError(f"Cannot read {path}: {exc}.") from None
