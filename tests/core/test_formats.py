"""The declared file formats (``core.formats``): strict types, unknown keys named with the nearest valid one,
a byte-order mark read, and the published JSON Schemas generated from the same declarations."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from gradscope.core import formats
from gradscope.core.errors import PlanError, TargetError
from gradscope.core.targets import Target
from gradscope.rules.plan import Plan

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (
            {"entries": [{"selector": "type:ReLU", "rule": "backward_as", "params": {"activation": "sigmoid"}}]},
            "entry 0: unknown key 'selector'; did you mean 'select'?",
        ),
        ({"entries": [{"rule": "zero"}]}, "entry 0: the key 'select' is missing"),
        ({"entries": [], "nmae": "x"}, "unknown key 'nmae'; did you mean 'name'?"),
        ({"entries": [], "name": 5}, "name: expected a string, got a whole number"),
        ({"entries": [{"select": "*", "rule": 3}]}, "entry 0, rule: expected a string, got a whole number"),
        ({"entries": [{"select": "*", "rule": "zero", "params": []}]}, "entry 0, params: expected an object"),
        ({"schema": "2", "entries": []}, "schema: expected a whole number, got a string"),
        ([{"select": "*", "rule": "zero", "parms": {}}], "entry 0: unknown key 'parms'; did you mean 'params'?"),
        ({"entries": [], "colour": 1}, "unknown key 'colour' (valid: entries, schema, name, $schema)"),
        ("a plan", "expected an object or a list, got a string"),
    ],
)
def test_a_bad_plan_is_one_line_naming_the_place(plan, message):
    with pytest.raises(PlanError) as info:
        Plan.from_dict(plan)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_good_plan_round_trips_and_may_name_its_editor_schema():
    plan = Plan(name="p").with_entry("type:ReLU", "scale", {"factor": 2.0}).with_entry("*", "zero")
    assert Plan.from_dict(plan.to_dict()) == plan
    assert Plan.from_dict(json.loads(plan.to_json())) == plan
    with_schema = {"$schema": "../docs/schemas/plan.schema.json", **plan.to_dict()}
    assert Plan.from_dict(with_schema) == plan
    assert Plan.from_dict([e.to_dict() for e in plan.entries]).entries == plan.entries  # a bare list


def test_utf8_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"entries": [{"select": "*", "rule": "zero"}]}).encode())
    assert Plan.load(path).entries[0].rule == "zero"
    path.write_bytes(b"\xff\xfe{}")  # not UTF-8 at all
    with pytest.raises(PlanError, match="not UTF-8"):
        Plan.load(path)


def test_targets_are_checked_not_coerced():
    assert Target.from_dict({"kind": "neuron", "node": "d", "neuron": [0, 2]}).neuron == (0, 2)
    with pytest.raises(TargetError, match="index: expected a whole number or null, got a string"):
        Target.from_dict({"index": "3"})
    with pytest.raises(TargetError, match="unknown key 'nod'; did you mean 'node'"):
        Target.from_dict({"kind": "channel", "nod": "c1", "channel": 0})


def test_the_declarations_mirror_the_objects_they_build():
    from gradscope.app.rendering.view import ViewSettings

    view_fields = {f.name: f.default for f in dataclasses.fields(ViewSettings)}
    struct_fields = {name: getattr(formats.ViewFile(), name) for name in formats.ViewFile.__struct_fields__}
    assert struct_fields == view_fields
    target_fields = {f.name for f in dataclasses.fields(Target)}
    assert set(formats.TargetFile.__struct_fields__) == target_fields


def _shape(schema: dict) -> dict:
    """What a schema promises, without the wording a msgspec release may change: per object, its keys, the
    required ones and whether others are refused."""
    objects = {"": schema, **schema.get("$defs", {})}
    return {
        name: (sorted(o.get("properties", {})), sorted(o.get("required", [])), o.get("additionalProperties"))
        for name, o in objects.items()
        if "properties" in o or name == ""
    }


def test_the_published_json_schemas_are_generated_from_the_declarations():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from write_schemas import schema_texts
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for filename, text in schema_texts().items():
        published = ROOT / "docs" / "schemas" / filename
        assert published.is_file(), f"docs/schemas/{filename} is missing: run scripts/write_schemas.py"
        assert _shape(json.loads(published.read_text())) == _shape(json.loads(text)), (
            f"docs/schemas/{filename} is out of date: run scripts/write_schemas.py"
        )
    plan_schema = json.loads((ROOT / "docs" / "schemas" / "plan.schema.json").read_text())
    entry = plan_schema["$defs"]["PlanEntryFile"]
    assert entry["additionalProperties"] is False and entry["required"] == ["select", "rule"]
