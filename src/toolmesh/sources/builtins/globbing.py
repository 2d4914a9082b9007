"""Glob patterns as regular expressions: ``**`` crosses folders, ``*`` and ``?`` do not,
``[...]`` is a character class and ``{a,b}`` an alternation."""

from __future__ import annotations

import functools
import re

__all__ = ["compile_glob"]


@functools.lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """The regex matching whole relative paths (``/``-separated) that ``pattern`` matches."""
    return re.compile("(?s:" + _translate(pattern) + r")\Z")


def _translate(pattern: str) -> str:
    out: list[str] = []
    i, n, depth = 0, len(pattern), 0
    while i < n:
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        i += 1
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", i + 1 if i < n and pattern[i] in "!^" else i)
            if end < 0:
                out.append(re.escape(char))
                continue
            body = pattern[i:end]
            i = end + 1
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
        elif char == "{":
            depth += 1
            out.append("(?:")
        elif char == "}" and depth:
            depth -= 1
            out.append(")")
        elif char == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(char))
    out.extend(")" * depth)
    return "".join(out)
