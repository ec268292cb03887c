"""JSON the user hands in (plans, sessions, class maps, vocabularies, sidecars), read within bounds: a size
limit before anything is parsed, nesting deeper than Python can follow, and (where the file is a mapping the
user writes by hand) a key given twice, each a one-line error naming the file, never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gradscope.core.errors import GradscopeError

#: The largest JSON file read (a plan or session is kilobytes; a vocabulary of 250k tokens ~5 MB).
MAX_JSON_BYTES = 64 << 20
#: Deeper nesting than any of gradscope's formats has; Python's own limit (~1000) would end in RecursionError.
MAX_DEPTH = 100


def parse_json(
    text: str | bytes,
    what: str,
    error: type[GradscopeError] = GradscopeError,
    *,
    unique_keys: bool = False,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """``text`` parsed; ``what`` names it in errors ("Plan file p.json"). ``unique_keys``: a key given twice in
    one object is an error naming its line (JSON lets the last one win silently)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise error(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
    text = text.removeprefix("\ufeff")
    depth = nesting_depth(text)
    if depth > max_depth:
        raise error(f"{what} is nested {depth} levels deep; gradscope reads at most {max_depth}.")
    hook = _unique_pairs(text, what, error) if unique_keys else None
    try:
        return json.loads(text, object_pairs_hook=hook)
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from None
    except RecursionError:  # a guard behind nesting_depth
        raise error(f"{what} is nested too deeply to read.") from None


def read_json_file(
    path: str | Path,
    what: str,
    error: type[GradscopeError] = GradscopeError,
    *,
    unique_keys: bool = False,
    max_bytes: int = MAX_JSON_BYTES,
) -> Any:
    """The JSON file at ``path``: not a regular file, unreadable, too large, not UTF-8, not JSON, too deep or (with
    ``unique_keys``) a repeated key are each an ``error`` with one line."""
    p = Path(path).expanduser()
    label = f"{what} {p.name}"
    if not p.exists():
        raise error(f"The {what} {p} does not exist.")
    if not p.is_file():
        raise error(f"The {what} {p} is not a regular file.")
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise error(f"The {label} is {size / 2**20:.0f} MiB; a {what} is at most {max_bytes >> 20} MiB.")
        raw = p.read_bytes()
    except OSError as exc:
        raise error(f"Cannot read the {what} {p}: {exc.strerror or exc}.") from None
    return parse_json(raw, label[:1].upper() + label[1:], error, unique_keys=unique_keys)


_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (strings skipped). Linear, no recursion."""
    if "[" not in text and "{" not in text:
        return 0
    depth = deepest = 0
    for match in _STRUCTURE.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _unique_pairs(text: str, what: str, error: type[GradscopeError]) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise error(f"{what}: the key {key!r} is given twice (line {_line_of_second(text, key)}).")
            out[key] = value
        return out

    return hook


def _line_of_second(text: str, key: str) -> int | str:
    """The line of the second ``"key":`` in ``text`` (where the repeated key is), or '?'."""
    pattern = re.compile(re.escape(json.dumps(key)) + r"\s*:")
    found = list(pattern.finditer(text))
    if len(found) < 2:
        pattern = re.compile(r'"' + re.escape(key) + r'"\s*:')
        found = list(pattern.finditer(text))
    return text.count("\n", 0, found[1].start()) + 1 if len(found) >= 2 else "?"
