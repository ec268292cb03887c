"""Write the JSON Schemas of the files a user writes or edits to docs/schemas/ (plan, session, sidecar).

They are generated from the one declaration gradscope validates with (``gradscope.core.formats``), so an
editor checking a plan against ``docs/schemas/plan.schema.json`` reports what gradscope would. A test fails
when they are out of date: run ``.venv/bin/python scripts/write_schemas.py`` after changing a format."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def schema_texts() -> dict[str, str]:
    from gradscope.core.formats import FORMATS, json_schema

    texts = {}
    for name, kind in FORMATS.items():
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": f"gradscope {name}",
            **json_schema(kind),
        }
        texts[f"{name}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return texts


def main() -> int:
    sys.path.insert(0, str(ROOT))
    out = ROOT / "docs" / "schemas"
    out.mkdir(parents=True, exist_ok=True)
    for filename, text in schema_texts().items():
        (out / filename).write_text(text)
        print(f"wrote docs/schemas/{filename}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
