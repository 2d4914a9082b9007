"""JSON that arrives from outside (a peer, a server, a model, a command line), parsed strictly.

``json.loads`` accepts NaN and Infinity (which are not JSON), lone surrogate escapes (text that
no UTF-8 codec can write back, into SQLite say) and nesting deep enough to raise RecursionError,
which is not a ValueError and so escapes the handlers written for bad input. pydantic-core's
parser refuses all three with a ValueError that names the place, and is faster.

A number too large for a float (``1e999``) is refused too: pydantic-core, like ``json.loads``,
reads it as infinity, which no JSON can carry on.
"""

from __future__ import annotations

import json
import json.encoder
import math
import re
from collections.abc import Callable
from typing import Any

from pydantic_core import from_json

__all__ = ["encoder", "loads", "mend_text"]

# The strings of a JSON text (skipped: text, not numbers) and its numbers.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?')


def loads(data: str | bytes | bytearray) -> Any:
    """The value of one JSON text; ``ValueError`` for anything that is not strict JSON."""
    try:
        value = from_json(data, allow_inf_nan=False)
    except TypeError:
        if isinstance(data, str):  # a str holding a lone surrogate: it has no UTF-8 form
            raise ValueError(
                "the text holds a lone surrogate, which is not valid Unicode"
            ) from None
        raise
    # Infinity can only come from a number too large for a float (the parser refuses the word):
    # found in what was read (cheaper than a scan of the text), then named from the text.
    if _holds_infinity(value, 0):
        _refuse_huge_numbers(data if isinstance(data, str) else bytes(data).decode())
    return value


def _holds_infinity(value: Any, depth: int) -> bool:
    """Whether ``value`` (as the parser made it) holds an infinite float."""
    if type(value) is float:
        return math.isinf(value)
    if type(value) is dict:
        value = value.values()
    elif type(value) is not list or depth > 1000:  # deeper than the parser reads
        return False
    for item in value:
        kind = type(item)
        if kind is float:
            if math.isinf(item):
                return True
        elif (kind is dict or kind is list) and _holds_infinity(item, depth + 1):
            return True
    return False


def _refuse_huge_numbers(text: str) -> None:
    """``ValueError`` naming the first number of ``text`` (valid JSON) beyond a float's range.
    Integers are read as ints of any size, never as infinity: only a number with a fraction or
    an exponent can be one."""
    for match in _TOKEN.finditer(text):
        number = match.group()
        if number[0] == '"' or not any(c in number for c in ".eE"):
            continue
        if math.isinf(float(number)):
            start = match.start()
            line = text.count("\n", 0, start) + 1
            column = start - text.rfind("\n", 0, start)
            shown = number if len(number) <= 40 else number[:20] + "..." + number[-10:]
            raise ValueError(
                f"the number {shown} is too large to be read as a float (it would be "
                f"infinity) at line {line} column {column}"
            )


def mend_text(value: Any) -> Any:
    """``value`` (str, dict, list) with every lone surrogate replaced by U+FFFD, so it can be
    written as UTF-8: what a tool read with ``surrogateescape`` (an odd filename) or a slice of
    UTF-16 that cut a pair. A pair of surrogates becomes the character it stands for."""
    if isinstance(value, str):
        if value.isascii():
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {mend_text(key): mend_text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [mend_text(item) for item in value]
    return value


def encoder(
    *, sort_keys: bool = False, compact: bool = False, default: Callable[[Any], Any] = str
) -> Callable[[Any], str]:
    """A JSON encoder built once (``json.dumps`` builds a new one on every call, which a call
    path pays): text as is (``ensure_ascii=False``), what JSON does not know as ``default`` makes
    it (its ``str``; a ``default`` that raises TypeError refuses it), and
    ``ValueError`` for NaN and infinity, which JSON has not. ``sort_keys`` as ``json.dumps``'s;
    ``compact``: no spaces after separators. Otherwise its text is ``json.dumps``'s."""
    key_separator, item_separator = (":", ",") if compact else (": ", ", ")
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the standard encoder, same output
        return json.JSONEncoder(
            sort_keys=sort_keys,
            separators=(item_separator, key_separator),
            ensure_ascii=False,
            default=default,
            allow_nan=False,
        ).encode
    # What JSONEncoder.iterencode passes for these options: the markers that detect a value
    # holding itself, default, string encoder, indent, the separators, sort_keys, skipkeys and
    # allow_nan.
    markers: dict[int, Any] = {}
    encode = make(
        markers,
        default,
        json.encoder.encode_basestring,
        None,
        key_separator,
        item_separator,
        sort_keys,
        False,
        False,
    )

    def encoded(value: Any) -> str:
        try:
            return "".join(encode(value, 0))
        except BaseException:
            markers.clear()  # a failed encoding leaves its marks, which keep the values alive
            raise

    return encoded
