"""The files a user writes or edits, each declared once: plans, session files and the sidecar read back.

The declarations are msgspec Structs: strict types (``"name": 5`` is an error, not "5"), unknown keys refused,
and the JSON Schemas published in ``docs/schemas/`` are generated from them (``scripts/write_schemas.py``; a
test keeps them in step). ``decode`` turns msgspec's errors into one line that names the place and, for a
misspelt key, the nearest valid one: "entry 0: unknown key 'selector'; did you mean 'select'?".
msgspec was chosen by import cost: ~40 ms with a Struct decoded, against ~200 ms for pydantic with a model
and ~110-170 ms for jsonschema (measured on this project's 2-core machine, see CHANGELOG).
"""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Union

import msgspec

from gradscope.core.errors import GradscopeError
from gradscope.core.json_text import parse_json, read_json_file

PLAN_SCHEMA = 2  # 2: a fused layer's id is its output (the activation), "<id>:pre" its linear part (1: "<id>:act")
SESSION_SCHEMA = 3  # 3: typed tokens and the vocabulary; 2: node ids as in plan schema 2
# 5: the explained next token; 4: per-position scores (tokens, features); 3: node ids as in plan schema 2; 2: one
# schema for every front end (view settings)
SIDECAR_SCHEMA = 5

MAX_PLAN_NAME = 200

# Editors validate a file against the schema its "$schema" key names; gradscope accepts and ignores the key.
_EDITOR_SCHEMA = msgspec.field(name="$schema", default=None)


class PlanEntryFile(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One plan entry: the nodes ``select`` names get ``rule`` with ``params`` (checked by the rule)."""

    select: str
    rule: str
    params: dict[str, Any] = {}


class PlanFile(msgspec.Struct, forbid_unknown_fields=True):
    """A plan: an ordered list of selector -> rule; later entries win."""

    entries: list[PlanEntryFile]
    schema: int = PLAN_SCHEMA
    name: Annotated[str, msgspec.Meta(max_length=MAX_PLAN_NAME)] = ""  # it names files and fills messages
    editor_schema: str | None = _EDITOR_SCHEMA


# A plan file may also be a bare list of entries.
PlanDocument = Union[PlanFile, list[PlanEntryFile]]  # noqa: UP007  (msgspec needs a runtime Union here)


class TargetFile(msgspec.Struct, forbid_unknown_fields=True):
    """What is explained: a class logit, a next token, a neuron or channel of a node, or a loss (``core.targets``)."""

    kind: str = "class"
    index: int | None = None
    node: str | None = None
    neuron: list[int] | None = None
    channel: int | None = None
    loss: str | None = None
    position: int | None = None
    contrast: int | None = None


class ViewFile(msgspec.Struct, forbid_unknown_fields=True):
    """How the map is read out and drawn (mirrors ``app.rendering.view.ViewSettings``; a test keeps them equal)."""

    colormap: str = "jet"
    alpha: float = 0.5
    normalization: str = "minmax"
    reduction: str = "max_abs"
    readout_node: str | None = "<input>"  # app.view.INPUT_KEY: the model input
    times_input: bool = False
    signed: bool = False
    grad_cam: bool = False
    style: str = "caffe"


class SessionFile(msgspec.Struct, forbid_unknown_fields=True):
    """A saved session (``*.gradscope.json``): the model, input, target, plan and view to restore."""

    model: str
    schema: int = SESSION_SCHEMA
    custom_objects: str | None = None
    image: str | None = None
    preprocessing: str = "unit"
    target: TargetFile = msgspec.field(default_factory=TargetFile)
    method: str | None = None
    plan: PlanFile = msgspec.field(default_factory=lambda: PlanFile(entries=[]))
    view: ViewFile = msgspec.field(default_factory=ViewFile)
    selected: str | None = None
    tokens: str | None = None  # token ids or words the user typed (the input, instead of ``image``)
    vocabulary: str | None = None  # the vocabulary file token ids were shown with (data, never code)
    editor_schema: str | None = _EDITOR_SCHEMA


class SidecarTarget(TargetFile, forbid_unknown_fields=True):
    class_index: int | None = None  # the class actually explained (top-1 resolved)


class SidecarPosition(msgspec.Struct, forbid_unknown_fields=True):
    """One position of a per-position map: a token (with its id) or a tabular feature."""

    index: int
    label: str
    score: float
    id: int | None = None  # the token id


class SidecarToken(msgspec.Struct, forbid_unknown_fields=True):
    """A token a language model's explanation names: its id, word (with a vocabulary), probability and logit."""

    id: int
    probability: float
    logit: float
    label: str | None = None


class SidecarNextToken(SidecarToken, forbid_unknown_fields=True):
    """The next token explained, at which position, and the contrast token when the target compares two."""

    position: int = 0
    contrast: SidecarToken | None = None


class SidecarGeneration(msgspec.Struct, forbid_unknown_fields=True):
    """A generation attributed token by token: the ids, every token's label, each generated token's probability;
    the matrix is in the CSV beside the picture (``scores_csv``: one row per generated token)."""

    prompt: list[int]
    generated: list[int]
    labels: list[str]
    probabilities: list[float]
    scores_csv: str


class SidecarAgreement(msgspec.Struct, forbid_unknown_fields=True):
    """An estimate against the exact effects (``core.patching.Agreement``)."""

    correlation: float | str  # "nan" where it is undefined (a constant map)
    top_k: int
    top_k_overlap: float | str
    wrong_sign: list[list[int]] = []


class SidecarPatching(msgspec.Struct, forbid_unknown_fields=True):
    """Patching effects (the picture is their heat map; the numbers in ``effects_csv``)."""

    method: str  # exact, atp, atp_star
    metric: str  # in words
    metric_kind: str  # logit, probability, loss
    clean: str  # the clean input (a path, "<text>", "<ids>")
    corrupt: str  # the corrupted input
    clean_value: float
    corrupt_value: float
    signed: bool
    components: dict[str, list[str]]  # component -> its node in each block
    units: list[str]  # token labels, or grid cells "row,col"
    effects_csv: str
    grid: list[int] | None = None
    agreement: dict[str, SidecarAgreement] = {}
    seconds: float = 0.0


class SidecarFile(msgspec.Struct, forbid_unknown_fields=True):
    """The JSON beside an exported PNG: what the picture shows, enough to reproduce it."""

    schema: int
    gradscope_version: str
    method: str
    plan: PlanFile
    target: SidecarTarget
    view: ViewFile
    model: str | None = None
    model_file: str | None = None
    image: str | None = None
    preprocessing: str = "unit"
    predicted_class: int | None = None
    readout_node: str | None = None
    changed_nodes: list[str] = []
    positions: list[SidecarPosition] = []  # a text or tabular input: one score per token / feature
    token_score: str | None = None  # how a token's score was read from the signal at its embedding
    explained_token: SidecarNextToken | None = None  # a language model's next-token target
    generation: SidecarGeneration | None = None  # a generation attributed (the picture is its matrix)
    patching: SidecarPatching | None = None  # patching effects (the picture is their heat map)
    alternate: str | None = None  # the other input the plan's value rules read (substitute_value, patch_value)
    export: dict[str, Any] = {}
    editor_schema: str | None = _EDITOR_SCHEMA


FORMATS: dict[str, Any] = {"plan": PlanDocument, "session": SessionFile, "sidecar": SidecarFile}


class FormatError(GradscopeError):
    """A file does not follow its declared format (the message names the place and the problem)."""


def decode(
    data: bytes | str | Any, kind: Any, *, what: str, error: type[GradscopeError] = FormatError, parsed: bool = False
) -> Any:
    """``data`` as ``kind``, else ``error`` with one line. ``data`` is JSON text or bytes, or with ``parsed``
    already-parsed JSON values (then a string is a value, not a document)."""
    value = parse_json(data, what, error) if not parsed and isinstance(data, (bytes, str)) else data
    try:
        return msgspec.convert(value, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise error(f"{what}: {explain(str(exc), kind)}") from None
    except RecursionError:
        raise error(f"{what} is nested too deeply to read.") from None


def read_file(path: str | Path, kind: Any, *, what: str, error: type[GradscopeError] = FormatError) -> Any:
    """The file at ``path`` decoded as ``kind`` (``what``: "plan file", "session file", "sidecar"), every failure
    an ``error`` with one line: not a regular file, unreadable, too large or deep, not UTF-8 / JSON, or not the
    format."""
    value = read_json_file(path, what, error)
    return decode(value, kind, what=f"{what[:1].upper()}{what[1:]} {Path(path).name}", error=error, parsed=True)


def encode(value: Any) -> Any:
    """Plain JSON values of a declared value (``editor_schema`` is written only when set)."""
    return msgspec.to_builtins(value)


_FIELD_PATTERNS = (
    (re.compile(r"Object contains unknown field `([^`]*)`"), "unknown key {!r}"),
    (re.compile(r"Object missing required field `([^`]*)`"), "the key {!r} is missing"),
)


def explain(message: str, kind: Any) -> str:
    """msgspec's "<problem> - at `$.entries[0]`" as "entry 0: <problem in words>; did you mean ...?"."""
    problem, _, at = message.partition(" - at `")
    path = at.rstrip("`") if at else "$"
    place = _place(path)
    for pattern, words in _FIELD_PATTERNS:
        found = pattern.search(problem)
        if found:
            key = found.group(1)
            text = words.format(key)
            if "unknown" in words:
                valid = _fields_at(kind, path)
                near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
                if near:
                    text += f"; did you mean {near[0]!r}?"
                elif valid:
                    text += f" (valid: {', '.join(valid)})"
            return f"{place}: {text}" if place else text
    problem = re.sub(r"`([^`]*)`", lambda m: _in_words(m.group(1)), problem).replace("Expected", "expected")
    return f"{place}: {problem}" if place else problem


_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "object": "an object",
    "array": "a list",
    "null": "null",
}


def _in_words(types: str) -> str:
    """msgspec's ``int | null`` as "a whole number or null"."""
    return " or ".join(_WORDS.get(t.strip(), t.strip()) for t in types.split("|"))


def _place(path: str) -> str:
    """``$.entries[0].params`` -> "entry 0, params"; ``$.view.alpha`` -> "view.alpha"; ``$`` -> ""."""
    text = path.removeprefix("$").lstrip(".")
    text = re.sub(r"^entries\[(\d+)\]\.?", lambda m: f"entry {m.group(1)}, ", text)
    text = re.sub(r"^\[(\d+)\]\.?", lambda m: f"entry {m.group(1)}, ", text)
    text = re.sub(r"plan\.entries\[(\d+)\]\.?", lambda m: f"plan entry {m.group(1)}, ", text)
    return text.strip(", ")


def _fields_at(kind: Any, path: str) -> list[str]:
    """The keys valid at ``path`` within ``kind`` (for "did you mean")."""
    current = kind
    for field, _index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        current = _struct_of(current, field) if field else _item_of(current)
        if current is None:
            return []
    struct = _struct_of(current, None)
    if struct is None:
        return []
    return [_encoded_name(struct, name) for name in struct.__struct_fields__]


def _struct_of(kind: Any, field: str | None) -> Any:
    """``kind`` itself (or the Struct inside a Union / list), or the type of its ``field``."""
    candidates = [kind]
    while candidates:
        t = candidates.pop(0)
        if isinstance(t, type) and issubclass(t, msgspec.Struct):
            if field is None:
                return t
            hints = typing.get_type_hints(t)
            names = {_encoded_name(t, n): n for n in t.__struct_fields__}
            if field in names:
                return hints[names[field]]
            continue
        candidates.extend(typing.get_args(t))
    return None


def _item_of(kind: Any) -> Any:
    """The item type of the list inside ``kind`` (a list, or a Union holding one)."""
    if typing.get_origin(kind) is list:
        return typing.get_args(kind)[0]
    for arg in typing.get_args(kind):
        if typing.get_origin(arg) is list:
            return typing.get_args(arg)[0]
    return None


def _encoded_name(struct: type, name: str) -> str:
    encoded = dict(zip(struct.__struct_fields__, struct.__struct_encode_fields__))
    return encoded.get(name, name)


def json_schema(kind: Any) -> dict[str, Any]:
    """The JSON Schema of a declared format (what ``docs/schemas/`` publishes)."""
    return msgspec.json.schema(kind)
