"""Reading the inputs of text and tabular models: token ids, text through a vocabulary, CSV rows. Plain
numpy: no TensorFlow (``model_inputs`` checks them against the model's graph).

Token ids are whole numbers: ``"12 7 99"``, ``"12,7,99"``, a ``.txt`` file of them or a ``.json`` list. Text
needs a vocabulary (one token per line, the line number is the id; or a JSON list, or a JSON object token ->
id): it is split on whitespace and punctuation, and every word must be in the vocabulary (or the vocabulary
must have an unknown token such as ``[UNK]``), so no word is silently dropped. A keras_hub tokenizer (a preset
folder holding ``tokenizer.json``) splits text as its model was trained.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradscope.core.errors import InputError
from gradscope.core.files import shorten
from gradscope.core.json_text import parse_json
from gradscope.core.numbers import int_or_none, is_whole
from gradscope.core.resources import bundled

UNKNOWN_TOKENS = ("[UNK]", "<unk>", "<UNK>", "[unk]", "<oov>", "[OOV]")
_WORDS = re.compile(r"\w+|[^\w\s]")
MAX_TEXT_FILE = 64 << 20  # a token or CSV file larger than this is not one input
MAX_VOCABULARY = 1 << 24  # ids a JSON vocabulary may give (the largest language models have ~256k tokens)


@dataclass(frozen=True)
class Vocabulary:
    """Tokens by id (``tokens[i]`` is id ``i``; ids without a token are None)."""

    tokens: tuple[str | None, ...]
    source: str = ""

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """A vocabulary file, or a keras_hub tokenizer: a preset folder (or its ``tokenizer.json``)."""
        path = bundled(path)
        if is_hub_tokenizer(path):
            return HubVocabulary.load_tokenizer(path)
        p = _readable(path, "vocabulary")
        text = _text(p)
        if p.suffix.lower() == ".json":
            data = _without_lone_surrogates(_json(p, text, unique_keys=True))
            if isinstance(data, list) and all(isinstance(t, str) for t in data):
                _refuse_repeats(p, data, "item")
                return cls(tuple(data), str(p))
            if isinstance(data, dict) and all(isinstance(i, int) and not isinstance(i, bool) for i in data.values()):
                if not data:
                    raise InputError(f"{p.name} is an empty vocabulary.")
                if min(data.values()) < 0:
                    raise InputError(f"{p.name} gives a token a negative id.")
                if max(data.values()) >= MAX_VOCABULARY:
                    raise InputError(
                        f"{p.name} gives a token the id {max(data.values())}; ids stop below {MAX_VOCABULARY}."
                    )
                tokens: list[str | None] = [None] * (max(data.values()) + 1)
                for token, i in data.items():
                    if tokens[i] is not None:
                        raise InputError(f"{p.name}: {shorten(tokens[i])!r} and {shorten(token)!r} both have id {i}.")
                    tokens[i] = token
                return cls(tuple(tokens), str(p))
            raise InputError(f"{p.name}: a JSON vocabulary is a list of tokens or an object token -> id.")
        lines = text.splitlines()
        if not any(lines):
            raise InputError(f"{p.name} is an empty vocabulary.")
        _refuse_repeats(p, lines, "line")
        return cls(tuple(lines), str(p))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def _index(self) -> dict[str, int]:
        index: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            if t is not None:
                index.setdefault(t, i)
        return index

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``: words and punctuation, as written, else lower-cased, else the unknown token;
        ``InputError`` naming the first word the vocabulary lacks when it has no unknown token."""
        index = self._index
        unknown = next((index[u] for u in UNKNOWN_TOKENS if u in index), None)
        ids = []
        for pos, word in enumerate(_WORDS.findall(text)):
            i = index.get(word, index.get(word.lower(), unknown))
            if i is None:
                raise InputError(
                    f"Word {pos} {word!r} is not in the vocabulary {Path(self.source).name or ''} and it has no "
                    f"unknown token ({', '.join(UNKNOWN_TOKENS[:2])}): type token ids instead, or another word."
                )
            ids.append(i)
        if not ids:
            raise InputError("The text has no words.")
        return np.array(ids, np.int64)

    def token_id(self, text: str) -> int:
        """One token as its id: a whole number is an id; else the token as written (a continuation such as
        ``--next cat``). ``InputError`` when it is not one token of this vocabulary."""
        text = text.strip()
        number = int_or_none(text)
        if number is not None:
            return number
        found = self._index.get(text)
        if found is None:
            raise InputError(f"{shorten(text)!r} is not a token of the vocabulary {Path(self.source).name}.")
        return found

    def decode(self, ids: Any) -> list[str]:
        """The token of each id (``#id`` where the vocabulary has none)."""
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            t = self.tokens[i] if 0 <= i < len(self.tokens) else None
            out.append(t if t is not None else f"#{i}")
        return out


HUB_TOKENIZER_FILE = "tokenizer.json"


def is_hub_tokenizer(path: str | Path) -> bool:
    """A keras_hub preset folder or its ``tokenizer.json`` (not a vocabulary file)."""
    p = Path(path).expanduser()
    return p.is_dir() or p.name == HUB_TOKENIZER_FILE


@dataclass(frozen=True)
class HubVocabulary(Vocabulary):
    """A keras_hub tokenizer as a vocabulary: text is split as the model was trained (WordPiece, BPE,
    SentencePiece), and a tokenizer with classification tokens (BERT's ``[CLS]``, ``[SEP]``) wraps the text in
    them, as keras_hub's classifier preprocessors do; a language model's (Llama 3, Gemma, GPT-2) starts it with
    its start token, as its causal-LM preprocessor does. Tokenizing runs in NumPy (keras_hub >= 0.32), so it is
    safe on any thread."""

    tokenizer: Any = None
    wrap: tuple[int | None, int | None] = (None, None)
    shown: tuple[str, ...] = ()  # how each token reads (a byte-level BPE's "Ġcat" as " cat"); () as written

    def decode(self, ids: Any) -> list[str]:
        """Each id's token as it reads: a byte-level BPE piece as the text it stands for (``" cat"``, not
        ``"Ġcat"``; a piece of a character as written), ``#id`` where the vocabulary has none."""
        if not self.shown:
            return super().decode(ids)
        known = lambda i: 0 <= i < len(self.shown) and self.tokens[i] is not None  # noqa: E731
        return [self.shown[i] if known(i) else f"#{i}" for i in np.asarray(ids).reshape(-1).tolist()]

    @classmethod
    def load_tokenizer(cls, path: str | Path) -> HubVocabulary:
        p = Path(path).expanduser()
        folder, config_file = (p, p / HUB_TOKENIZER_FILE) if p.is_dir() else (p.parent, p)
        from gradscope.io.checkpoints import checkpoint_kind

        if checkpoint_kind(folder) == "transformers":
            return cls._from_transformers_folder(folder)
        config = _json(config_file, _text(_readable(config_file, "keras_hub tokenizer config")))
        module = config.get("module", "") if isinstance(config, dict) else ""
        if not module.startswith("keras_hub."):  # only keras_hub's own classes, never a module a file names
            raise InputError(f"{config_file} is not a keras_hub tokenizer (its module is {module!r}).")
        from gradscope.io._keras import import_keras_hub, missing_hf

        try:
            import_keras_hub()  # registers its classes
        except ImportError as exc:
            raise InputError(missing_hf(f"The keras_hub tokenizer in {folder}", exc)) from exc
        from gradscope.io._keras import import_keras

        try:
            tokenizer = import_keras().saving.deserialize_keras_object(config, safe_mode=True)
            tokenizer.load_preset_assets(str(folder))
            tokens = tokens_by_id(tokenizer)
        except Exception as exc:  # noqa: BLE001 - a broken preset is the user's input: one line
            raise InputError(f"Cannot load the keras_hub tokenizer in {folder}: {type(exc).__name__}: {exc}") from exc
        wrap = (getattr(tokenizer, "cls_token_id", None), getattr(tokenizer, "sep_token_id", None))
        if None in wrap:  # a language model's tokenizer: its preprocessor starts the text with the start token
            wrap = (getattr(tokenizer, "start_token_id", None), None)
        return cls(tokens, str(folder), tokenizer, wrap, readable_tokens(tokenizer, tokens))

    @classmethod
    def _from_transformers_folder(cls, folder: Path) -> HubVocabulary:
        """A Hugging Face folder's tokenizer, converted by keras_hub's converter of its family (data: vocabulary,
        merges or a SentencePiece model; nothing in the folder runs)."""
        from gradscope.io._keras import import_keras_hub, missing_hf
        from gradscope.io.checkpoints.files import check_folder_files

        check_folder_files(folder)  # vocab.json -> /dev/zero, a FIFO: one line before keras_hub reads them
        try:
            keras_hub = import_keras_hub()
        except ImportError as exc:
            raise InputError(missing_hf(f"The Hugging Face tokenizer in {folder}", exc)) from exc
        try:
            tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(str(folder.resolve()))
            tokens = tokens_by_id(tokenizer)
        except Exception as exc:  # noqa: BLE001 - a tokenizer keras_hub cannot convert: one line
            raise InputError(
                f"keras_hub cannot convert the tokenizer in {folder} ({type(exc).__name__}: {exc}); give token ids."
            ) from exc
        wrap = (getattr(tokenizer, "start_token_id", None), None)
        return cls(tokens, str(folder), tokenizer, wrap, readable_tokens(tokenizer, tokens))

    def token_id(self, text: str) -> int:
        """A continuation as the tokenizer splits it: an id, a word that continues a text as one token (``mat``:
        " mat", as a byte-pair vocabulary writes a word after a space, not the bare piece "mat"), a token as the
        vocabulary writes it, or text the tokenizer makes one token of."""
        if text and not text[0].isspace() and not is_whole(text):
            spaced = self._ids(" " + text)
            if len(spaced) == 1:
                return spaced[0]
        if is_whole(text) or text in self._index:
            return super().token_id(text) if text not in self._index else self._index[text]
        ids = self._ids(text)
        if len(ids) != 1:
            pieces = " ".join(self.decode(ids))
            raise InputError(f"{shorten(text)!r} is {len(ids)} tokens ({shorten(pieces)}); give one token or its id.")
        return ids[0]

    def _ids(self, text: str) -> list[int]:
        return [int(i) for i in np.asarray(self.tokenizer.tokenize(unicode_text(text))).reshape(-1)]

    def encode(self, text: str) -> np.ndarray:
        ids = self._ids(text)
        if not ids:
            raise InputError("The text has no words.")
        start, end = self.wrap
        return np.array(([start] if start is not None else []) + ids + ([end] if end is not None else []), np.int64)


def tokens_by_id(tokenizer: Any) -> tuple[str | None, ...]:
    """A keras_hub tokenizer's tokens, ``tokens[i]`` the token of id ``i``. A byte-pair tokenizer's vocabulary is
    its ``vocab.json`` (token -> id), whose keys need not be in id order: ``get_vocabulary()`` lists them in the
    file's order, which named other tokens than the ids meant."""
    by_token = getattr(tokenizer, "vocabulary", None)
    if not isinstance(by_token, dict):  # WordPiece and SentencePiece list their tokens in id order
        return tuple(str(t) for t in tokenizer.get_vocabulary())
    ids = [i for i in by_token.values() if isinstance(i, int) and 0 <= i < MAX_VOCABULARY]
    tokens: list[str | None] = [None] * (max(ids) + 1 if ids else 0)
    for token, i in by_token.items():
        if isinstance(i, int) and 0 <= i < len(tokens) and tokens[i] is None:
            tokens[i] = str(token)
    return tuple(tokens)


def unicode_text(text: str) -> str:
    """``text`` when it is valid Unicode; a lone surrogate (half of a UTF-16 pair, or a byte that was not UTF-8 on
    the command line, which Python keeps as one) is one line naming where, before a tokenizer fails on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        what = (
            f"the byte 0x{code - 0xDC00:02x}, which is not UTF-8"
            if 0xDC80 <= code <= 0xDCFF
            else f"a lone surrogate U+{code:04X}"
        )
        raise InputError(f"The text is not valid Unicode: character {exc.start} is {what}.") from None
    return text


def readable_tokens(tokenizer: Any, tokens: tuple[str | None, ...]) -> tuple[str, ...]:
    """A byte-level BPE vocabulary (GPT-2, Llama 3, Qwen: each byte written as a printable character, a space as
    ``Ġ``) as the text each token stands for; () for other tokenizers (their tokens read as they are)."""
    try:
        from keras_hub.src.tokenizers.byte_pair_tokenizer import BytePairTokenizer, bytes_to_unicode
    except ImportError:
        return ()
    if not isinstance(tokenizer, BytePairTokenizer):
        return ()
    byte_of = {c: b for b, c in zip(*bytes_to_unicode())}
    shown = []
    for token in tokens:
        if token is None:  # an id the vocabulary skips
            shown.append("")
            continue
        if any(ch not in byte_of for ch in token):  # a special token added as it is
            shown.append(token)
            continue
        try:
            shown.append(b"".join(byte_of[ch] for ch in token).decode("utf-8"))
        except UnicodeDecodeError:  # part of a multi-byte character: as the vocabulary writes it
            shown.append(token)
    return tuple(shown)


def parse_token_ids(text: str) -> np.ndarray:
    """``"12 7 99"`` or ``"12,7,99"`` (or ``[12, 7, 99]``) as int64 ids; ``InputError`` naming a non-id."""
    parts = [p for p in re.split(r"[\s,\[\]]+", text.strip()) if p]
    if not parts:
        raise InputError("No token ids given: write them as '12 7 99'.")
    ids = []
    for pos, part in enumerate(parts):
        value = int_or_none(part)
        if value is None:
            raise InputError(
                f"Token {pos} {part!r} is not a token id (a whole number); to type words, give a vocabulary."
            )
        ids.append(value)
    return _id_array(ids)


def read_token_file(path: str | Path) -> np.ndarray:
    """Token ids from a ``.txt`` (ids separated by spaces, commas or lines) or ``.json`` (a list of ids, or
    ``{"ids": [...]}``) file."""
    p = _readable(path, "token file")
    text = _text(p)
    if p.suffix.lower() == ".json":
        data = _json(p, text)
        data = data.get("ids") if isinstance(data, dict) else data
        if not isinstance(data, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in data):
            raise InputError(f'{p.name}: give the token ids as a JSON list of whole numbers (or {{"ids": [...]}}).')
        if not data:
            raise InputError(f"{p.name} holds no token ids.")
        return _id_array(data, f"{p.name}: ")
    try:
        return parse_token_ids(text)
    except InputError as exc:
        raise InputError(f"{p.name}: {exc}") from None


@dataclass(frozen=True)
class TableRow:
    """One row of a CSV file: its values and the column names (``col0``... when the file has no header)."""

    values: np.ndarray  # float32 (features,)
    names: tuple[str, ...]


def read_csv_row(path: str | Path, row: int = 0) -> TableRow:
    """Row ``row`` (0: the first data row) of a CSV file of numbers, with its header if the first line has
    names. ``InputError`` naming the cell that is not a number."""
    p = _readable(path, "CSV file")
    rows = [r for r in csv.reader(io.StringIO(_text(p), newline="")) if any(c.strip() for c in r)]
    if not rows:
        raise InputError(f"{p.name} has no rows.")
    header: tuple[str, ...] | None = None
    if any(not _is_number(c) for c in rows[0]):
        header, rows = tuple(c.strip() for c in rows[0]), rows[1:]
    if not 0 <= row < len(rows):
        raise InputError(f"{p.name} has {len(rows)} data row(s); row {row} does not exist (rows count from 0).")
    cells = rows[row]
    names = header or tuple(f"col{i}" for i in range(len(cells)))
    if len(cells) != len(names):
        raise InputError(f"{p.name}: row {row} has {len(cells)} values for {len(names)} columns.")
    for name, cell in zip(names, cells):
        if not _is_number(cell):
            raise InputError(f"{p.name}: row {row}, column {name!r} is {cell!r}, not a number.")
    return TableRow(np.array([float(c) for c in cells], np.float32), names)


def _id_array(ids: list[int], where: str = "") -> np.ndarray:
    """int64 ids; one past int64's range is named (NumPy would raise OverflowError)."""
    for pos, value in enumerate(ids):
        if not -(2**63) <= value < 2**63:
            raise InputError(f"{where}token {pos} ({shorten(str(value), 30)}) is far beyond any vocabulary.")
    return np.array(ids, np.int64)


def _without_lone_surrogates(data: Any) -> Any:
    """JSON may escape half a UTF-16 pair (``"\\ud800"``): no text can hold it (writing or drawing it fails), so
    such a token is kept under its escaped spelling, its id unchanged."""

    def text(s: Any) -> Any:
        return s.encode("utf-8", "backslashreplace").decode("utf-8") if isinstance(s, str) else s

    if isinstance(data, list):
        return [text(s) for s in data]
    if isinstance(data, dict):
        return {text(k): v for k, v in data.items()}
    return data


def _json(p: Path, text: str, unique_keys: bool = False) -> Any:
    return parse_json(text, p.name, InputError, unique_keys=unique_keys)


def _text(p: Path) -> str:
    """A text file's content: UTF-8 (a byte-order mark allowed), else one line saying where it is not."""
    try:
        return p.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise InputError(f"{p.name} is not UTF-8 text (byte {exc.start}, line {line}: {exc.reason}).") from None


def _refuse_repeats(p: Path, tokens: list[str], where: str) -> None:
    """A token listed twice gets two ids, and text would silently use the first: name both places."""
    first: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if not token:
            continue  # blank lines hold no token
        if token in first:
            n = 1 if where == "line" else 0  # lines count from 1, JSON items from 0 (as ids)
            raise InputError(
                f"{p.name}: the token {shorten(token)!r} is on {where} {first[token] + n} and {where} {i + n}; "
                "a vocabulary lists each token once (its position is its id)."
            )
        first[token] = i


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _readable(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"The {what} {p} does not exist or is not a file.")
    if p.stat().st_size > MAX_TEXT_FILE:
        raise InputError(f"The {what} {p.name} is {p.stat().st_size >> 20} MiB; one input is far smaller.")
    return p
