"""JSON from outside: refused when it is not strict JSON, always with a ValueError."""

from __future__ import annotations

import pytest

from toolmesh import strictjson


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (b"[" * 5000 + b"]" * 5000, "recursion limit"),  # json.loads: RecursionError
        ('{"x": NaN}', "expected value"),
        ('{"x": -Infinity}', "invalid number"),
        ('"\\ud800"', "hex escape"),  # a lone surrogate, escaped
        ('"a\ud800"', "lone surrogate"),  # a str holding one
        (b"\xff", "expected value"),  # not UTF-8
        ("", "EOF"),
    ],
)
def test_what_is_not_strict_json_is_a_value_error(text: str | bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        strictjson.loads(text)


def test_json_is_read_as_json() -> None:
    assert strictjson.loads('{"a": [1, 2.5, "\\ud83d\\ude00", null, true], "a": 3}') == {"a": 3}
    assert strictjson.loads(b"123456789012345678901234567890") == 123456789012345678901234567890
