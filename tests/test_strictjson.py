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


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("1e999", r"the number 1e999 is too large .* at line 1 column 1"),
        ('{"x": -2.5E+400}', r"the number -2.5E\+400 .* line 1 column 7"),
        (b"[1.5e308,\n 2e308]", r"the number 2e308 .* line 2 column 2"),
        ("9" * 300 + "e99", r"the number 9{20}\.\.\.9{7}e99 is too large"),
        ('{"s": "3e999 \\" 4e999", "x": 1' + "0" * 400 + ".0}", r"the number 10{19}\.\.\."),
    ],
)
def test_a_number_beyond_a_float_is_refused_naming_it(text: str | bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        strictjson.loads(text)


def test_big_integers_tiny_floats_and_number_like_text_are_read() -> None:
    huge = int("1" + "0" * 400)
    assert strictjson.loads("1" + "0" * 400) == huge  # an int of any size, not a float
    assert strictjson.loads("[1e-999, 1.7976931348623157e308]") == [0.0, 1.7976931348623157e308]
    assert strictjson.loads('{"id": "2e999", "n": "' + "1" * 30 + '"}') == {
        "id": "2e999",
        "n": "1" * 30,
    }
