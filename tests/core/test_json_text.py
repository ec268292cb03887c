"""JSON read within bounds: size, depth, repeated keys (core.json_text)."""

from __future__ import annotations

import pytest

from gradscope.core.errors import GradscopeError
from gradscope.core.json_text import nesting_depth, parse_json, read_json_file


def test_nesting_far_past_pythons_limit_is_one_line():
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 5000 + "1" + "}" * 5000):
        with pytest.raises(GradscopeError, match="nested .* levels deep"):
            parse_json(text, "Plan file p.json")


def test_depth_skips_brackets_in_strings():
    assert nesting_depth('{"a": "[[[[{{{{", "b": [1, [2]]}') == 3
    assert nesting_depth('"\\"[["') == 0
    assert parse_json('{"a": "[[[["}', "x") == {"a": "[[[["}


def test_a_repeated_key_is_named_with_its_line():
    text = '{\n  "1": 0,\n  "2": 1,\n  "1": 5\n}'
    assert parse_json(text, "Class map m.json") == {"1": 5, "2": 1}  # plain JSON: the last wins
    with pytest.raises(GradscopeError, match=r"key '1' is given twice \(line 4\)"):
        parse_json(text, "Class map m.json", unique_keys=True)


def test_files_too_large_not_utf8_or_not_json(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"[" + b"0," * 600 + b"0]")
    with pytest.raises(GradscopeError, match="at most 0 MiB"):
        read_json_file(big, "plan file", max_bytes=1000)
    latin = tmp_path / "l.json"
    latin.write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(GradscopeError, match="not UTF-8"):
        read_json_file(latin, "plan file")
    with pytest.raises(GradscopeError, match=r"not valid JSON.*line 1"):
        parse_json("{nope", "x")
    with pytest.raises(GradscopeError, match="not a regular file"):
        read_json_file(tmp_path, "plan file")
    with pytest.raises(GradscopeError, match="does not exist"):
        read_json_file(tmp_path / "missing.json", "plan file")
