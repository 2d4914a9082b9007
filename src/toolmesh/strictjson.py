"""JSON that arrives from outside (a peer, a server, a model, a command line), parsed strictly.

``json.loads`` accepts NaN and Infinity (which are not JSON), lone surrogate escapes (text that
no UTF-8 codec can write back, into SQLite say) and nesting deep enough to raise RecursionError,
which is not a ValueError and so escapes the handlers written for bad input. pydantic-core's
parser refuses all three with a ValueError that names the place, and is faster.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import from_json

__all__ = ["loads", "mend_text"]


def loads(data: str | bytes | bytearray) -> Any:
    """The value of one JSON text; ``ValueError`` for anything that is not strict JSON."""
    try:
        return from_json(data, allow_inf_nan=False)
    except TypeError:
        if isinstance(data, str):  # a str holding a lone surrogate: it has no UTF-8 form
            raise ValueError(
                "the text holds a lone surrogate, which is not valid Unicode"
            ) from None
        raise


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
