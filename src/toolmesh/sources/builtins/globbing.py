"""Glob patterns as regular expressions: ``**`` crosses folders, ``*``, ``?`` and ``[...]`` do
not, and ``{a,b}`` is an alternation.

The translation keeps Python's backtracking ``re`` polynomial on any pattern: ``*a*a*a*b``
against a long name would otherwise take exponential time with the GIL held, freezing the
event loop and every deadline. So:

- ``{a,b}`` groups are expanded first into whole alternatives (a bounded number of them): each
  alternative is then fixed-length chunks joined by stars;
- a star and the chunk after it become an atomic lazy group, ``(?>[^/]*?chunk)``, committed to
  the chunk's leftmost match (as CPython's ``fnmatch.translate`` does). Committing is safe when
  the next star can take in what it skips: a ``*`` after a ``*`` (the skipped text holds no
  ``/``, since ``?`` and classes never match one), or a ``**`` after anything. A ``**`` followed
  by ``*``s commits once, at the next ``**``, over the whole run: there its leftmost match is
  also the one that ends first.
"""

from __future__ import annotations

import enum
import functools
import re
from typing import TypeAlias

__all__ = ["MAX_ALTERNATIVES", "compile_glob"]

MAX_ALTERNATIVES = 256  # {a,b} groups multiply; past this the pattern is refused
SEGMENT_START = r"(?<![^/])"  # at the start of the path or right after a '/'


class _Star(enum.Enum):
    """A wildcard; its value is the regex of one character it takes."""

    ONE_FOLDER = "[^/]"  # *
    ANY = "."  # **
    FOLDERS = "/"  # **/ : nothing, or anything ending with '/'


_Token: TypeAlias = str | _Star  # a str is the regex of exactly one character
_Item: TypeAlias = "_Token | list[list[_Item]]"  # a list is a {a,b} group: its alternatives


@functools.lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """The regex matching whole relative paths (``/``-separated) that ``pattern`` matches.
    A malformed pattern (``[z-a]``, too many alternatives) raises ValueError naming it."""
    alternatives = [_translate(tokens) for tokens in _alternatives(pattern)]
    return re.compile("(?s:" + "|".join(dict.fromkeys(alternatives)) + ")")


# -- parsing -----------------------------------------------------------------------------------


def _parse(pattern: str) -> list[_Item]:
    """Tokens and ``{a,b}`` groups. ``,`` and ``}`` outside a group are plain characters, a
    group left open closes at the end, and a ``[`` that nothing closes is a plain ``[``."""
    top: list[_Item] = []
    groups: list[list[list[_Item]]] = []  # the open groups, innermost last
    current = top
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if pattern.startswith("**/", i):
            current.append(_Star.FOLDERS)
            i += 3
            continue
        if pattern.startswith("**", i):
            current.append(_Star.ANY)
            i += 2
            continue
        i += 1
        if char == "*":
            current.append(_Star.ONE_FOLDER)
        elif char == "?":
            current.append("[^/]")
        elif char == "[":
            token, i = _char_class(pattern, i)
            current.append(token)
        elif char == "{":
            group: list[list[_Item]] = [[]]
            current.append(group)
            groups.append(group)
            current = group[-1]
        elif char == "," and groups:
            groups[-1].append([])
            current = groups[-1][-1]
        elif char == "}" and groups:
            groups.pop()
            current = groups[-1][-1] if groups else top
        else:
            current.append(re.escape(char))
    return top


def _char_class(pattern: str, start: int) -> tuple[str, int]:
    """The regex of the ``[...]`` whose body starts at ``start``, and the index after it.
    ``!`` or ``^`` first negates; ``]`` first is a member; a class never matches ``/``."""
    i = start + 1 if pattern[start : start + 1] in ("!", "^") else start
    end = pattern.find("]", i + 1 if pattern[i : i + 1] == "]" else i)
    if end < 0:
        return re.escape("["), start
    negated = i > start
    members = pattern[i:end]
    ranges = _ranges(members)
    for low, high in ranges:
        if low > high:
            raise ValueError(
                f"invalid glob pattern {pattern!r}: the range {low}-{high} in "
                f"{pattern[start - 1 : end + 1]!r} runs backwards (write {high}-{low})"
            )
    body = "".join(
        re.escape(lo) if lo == hi else f"{re.escape(lo)}-{re.escape(hi)}" for lo, hi in ranges
    )
    if negated:
        return f"[^/{body}]", end + 1
    takes_slash = any(low <= "/" <= high for low, high in ranges)
    return ("(?!/)" if takes_slash else "") + f"[{body}]", end + 1


def _ranges(members: str) -> list[tuple[str, str]]:
    """``a-z0`` as [("a", "z"), ("0", "0")]; a ``-`` first or last is itself."""
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(members):
        if i + 2 < len(members) and members[i + 1] == "-":
            found.append((members[i], members[i + 2]))
            i += 3
        else:
            found.append((members[i], members[i]))
            i += 1
    return found


# -- expanding ---------------------------------------------------------------------------------


def _alternatives(pattern: str) -> list[list[_Token]]:
    """The pattern as brace-free token lists, with every ``**/`` rooted at a folder start."""
    flat: list[list[_Token]] = []
    for tokens in _expand(_parse(pattern), pattern):
        flat.extend(_root_folders(tokens))
        _check_count(len(flat), pattern)
    return flat


def _expand(items: list[_Item], pattern: str) -> list[list[_Token]]:
    results: list[list[_Token]] = [[]]
    for item in items:
        if isinstance(item, list):
            options = [tokens for branch in item for tokens in _expand(branch, pattern)]
        else:
            options = [[item]]
        _check_count(len(results) * len(options), pattern)
        results = [done + option for done in results for option in options]
    return results


def _root_folders(tokens: list[_Token]) -> list[list[_Token]]:
    """``**/`` after a ``/`` (or first) means "from the start of any folder below". Elsewhere,
    as in ``a**/b``, it also matches nothing at all ("ab"): split into both readings."""
    for index, token in enumerate(tokens):
        if token is _Star.FOLDERS and index and tokens[index - 1] != "/":
            before, after = tokens[:index], tokens[index + 1 :]
            return [
                *_root_folders(before + after),
                *_root_folders([*before, _Star.ANY, "/", *after]),
            ]
    return [tokens]


def _check_count(count: int, pattern: str) -> None:
    if count > MAX_ALTERNATIVES:
        raise ValueError(
            f"invalid glob pattern {pattern!r}: it expands to more than {MAX_ALTERNATIVES} "
            "alternatives (each {a,b} choice, and each '**/' inside a name, counts); simplify it"
        )


# -- translating -------------------------------------------------------------------------------


def _translate(tokens: list[_Token]) -> str:
    """One brace-free alternative as a regex anchored at the end (see the module docstring)."""
    prefix, stars = _chunks(tokens)
    out = ["".join(prefix)]
    run_open = False  # inside the atomic group of a '**' followed by '*'s
    for index, (star, chunk) in enumerate(stars):
        body = "".join(chunk)
        later = [kind for kind, _ in stars[index + 1 :]]
        if not later:  # the last star: greedy, the rest must reach the end
            out.append(f"{star.value}*{body}")
            break
        if star is _Star.ONE_FOLDER or later[0] is _Star.ANY:
            out.append(f"(?>{star.value}*?{body})")
        elif _Star.ANY in later:
            out.append(f"(?>.*?{body}")
            run_open = True
            continue
        else:  # a '**' followed only by '*'s: it alone backtracks, over one position each
            out.append(f".*{body}")
        if run_open and later[0] is _Star.ANY:
            out.append(")")
            run_open = False
    return "".join(out) + r"\Z"


def _chunks(tokens: list[_Token]) -> tuple[list[str], list[tuple[_Star, list[str]]]]:
    """The fixed chunk before the first star, then each star (``*`` or ``**``) with the fixed
    chunk after it. Adjacent stars merge into the wider; ``**/`` is a ``**`` whose chunk
    starts at a folder start."""
    prefix: list[str] = []
    stars: list[tuple[_Star, list[str]]] = []
    chunk = prefix
    for token in tokens:
        if not isinstance(token, _Star):
            chunk.append(token)
            continue
        kind = _Star.ONE_FOLDER if token is _Star.ONE_FOLDER else _Star.ANY
        if stars and not chunk:
            if kind is _Star.ANY:
                stars[-1] = (kind, chunk)
        else:
            chunk = []
            stars.append((kind, chunk))
        if token is _Star.FOLDERS:
            chunk.append(SEGMENT_START)
    return prefix, stars
