"""glob and grep over the workspace (capability fs::read).

Both walk the working folder without following symlinked folders, skip the ``ignore`` folders,
and stop at their result limits with ``more`` set. grep's pattern is a regular expression run
with a time limit per line (the ``regex`` module), so a pattern with catastrophic backtracking
ends with an error instead of holding a thread.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import regex

from toolmesh.sources.builtins.base import make_tool, schema
from toolmesh.sources.builtins.confine import HardLinked, PathRefused, Roots, check_text
from toolmesh.sources.builtins.files import READ, SNIFF_BYTES, FileSettings, capabilities_of
from toolmesh.sources.builtins.globbing import compile_glob
from toolmesh.tools import Output, Tool, ToolContext, run_blocking

__all__ = ["glob_tool", "grep_tool"]

MAX_LINE_CHARS = 400
REGEX_SECONDS = 2.0  # per line; a pattern slower than this is pathological
NAMED_SKIPS = 3  # up to this many files not searched are named in the answer, with why
LISTED_SKIPS = 20  # ... and listed in its data
HARD_LINKED = "with more than one hard link (allow_hardlinks admits them)"


def glob_tool(roots: Roots, settings: FileSettings) -> Tool:
    async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
        result: Output = await run_blocking(_glob, roots, settings, args["pattern"], ctx)
        return result

    return make_tool(
        "glob",
        "Find files of the workspace by glob pattern, e.g. '**/*.py' or 'src/*.{js,ts}'. "
        "'**' crosses folders; '*' and '?' do not.",
        schema(["pattern"], pattern={"type": "string", "description": "Glob pattern."}),
        run,
        capabilities=capabilities_of(settings, READ),
        idempotent=True,
    )


def _glob(roots: Roots, settings: FileSettings, pattern: str, ctx: ToolContext) -> Output:
    _check_pattern(pattern)
    matcher = compile_glob(pattern)
    found: list[str] = []
    more = False
    for relative, _is_dir in _walk(roots.home, settings, ctx, dirs=True):
        if matcher.match(relative):
            if len(found) == settings.max_entries:
                more = True
                break
            found.append(relative)
    found.sort()
    text = "\n".join(found) if found else f"no files match {pattern!r}"
    if more:
        text += f"\n[stopped at {settings.max_entries} matches; narrow the pattern]"
    return Output({"pattern": pattern, "matches": found, "more": more}, text=text)


def _check_pattern(pattern: str) -> None:
    check_text(pattern)
    if pattern.startswith("/"):
        raise PathRefused(f"glob pattern {pattern!r} is absolute; patterns are relative")
    if ".." in pattern.split("/"):
        raise PathRefused(f"glob pattern {pattern!r} uses '..' to leave the workspace")


def _walk(
    top: str, settings: FileSettings, ctx: ToolContext, *, dirs: bool = False
) -> Iterator[tuple[str, bool]]:
    """Relative paths under ``top`` (files, and folders when ``dirs``), symlinks not followed.
    ``os.fwalk`` descends through opened descriptors: a folder swapped for a symlink while the
    walk runs is not entered (``os.walk`` would list wherever the link points)."""
    ignore = set(settings.ignore)
    for current, folders, files, _fd in os.fwalk(top, follow_symlinks=False):
        if ctx.cancelled:
            return
        folders[:] = sorted(f for f in folders if f not in ignore)
        base = os.path.relpath(current, top)
        prefix = "" if base == "." else base + "/"
        if dirs:
            for folder in folders:
                yield prefix + folder, True
        for name in sorted(files):
            yield prefix + name, False


def grep_tool(roots: Roots, settings: FileSettings) -> Tool:
    async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
        result: Output = await run_blocking(
            _grep, roots, settings, args["pattern"], args.get("path"), args.get("include"), ctx
        )
        return result

    return make_tool(
        "grep",
        "Search file contents of the workspace with a regular expression. `path` limits the "
        "search to a file or folder; `include` is a glob such as '*.py' (matched against the file "
        "name, or the relative path when it contains '/'). Answers 'path:line: text'.",
        schema(
            ["pattern"],
            pattern={"type": "string", "minLength": 1, "description": "Regular expression."},
            path={"type": "string", "description": "File or folder to search (default: all)."},
            include={"type": "string", "description": "Glob of the files to search."},
        ),
        run,
        capabilities=capabilities_of(settings, READ),
        idempotent=True,
    )


def _grep(
    roots: Roots,
    settings: FileSettings,
    pattern: str,
    path: str | None,
    include: str | None,
    ctx: ToolContext,
) -> Output:
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None
    real = roots.resolve(path or ".")
    if include is not None:
        _check_pattern(include)
    matcher = compile_glob(include) if include else None
    named_file = not os.path.isdir(real)
    matches: list[dict[str, Any]] = []
    skipped: list[tuple[str, _Skip]] = []
    more = False
    for shown, file_real in _files_under(roots, real, settings, ctx):
        if ctx.cancelled:
            break  # past the deadline: the caller has its answer, stop working for it
        if matcher is not None:
            subject = shown if "/" in (include or "") else os.path.basename(shown)
            if not matcher.match(subject):
                continue
        hits = _search_file(roots, file_real, compiled, settings, ctx)
        if isinstance(hits, _Skip):
            if named_file:
                raise hits.error(hits.detail)
            skipped.append((shown, hits))
            continue
        for number, text in hits:
            if len(matches) == settings.max_results:
                more = True
                break
            matches.append({"path": shown, "line": number, "text": text})
        if more:
            break
    matches.sort(key=lambda m: (m["path"], m["line"]))
    return _grep_answer(pattern, matches, more, skipped, settings)


@dataclass(frozen=True, slots=True)
class _Skip:
    """A file grep did not search: ``kind`` counts alike ones, ``detail`` says it of this one,
    ``error`` answers a grep of this one file (as read_file would refuse it)."""

    kind: str
    detail: str
    error: type[Exception] = ValueError
    quiet: bool = False  # left out of the answer's text: a binary file holds no lines to match


def _grep_answer(
    pattern: str,
    matches: list[dict[str, Any]],
    more: bool,
    skipped: list[tuple[str, _Skip]],
    settings: FileSettings,
) -> Output:
    lines = [f"{m['path']}:{m['line']}: {m['text']}" for m in matches]
    told = [item for item in skipped if not item[1].quiet]
    if lines:
        out = "\n".join(lines)
    else:
        out = f"no matches for {pattern!r}" + (" in the files searched" if told else "")
    if more:
        out += f"\n[stopped at {settings.max_results} matches; narrow the search]"
    if told:  # their matches, if any, are missing: say so rather than "no matches"
        out += "\n" + _skipped_note(told)
    data = {
        "pattern": pattern,
        "matches": matches,
        "more": more,
        "skipped_files": len(skipped),
        "skipped": [{"path": p, "reason": s.detail} for p, s in skipped[:LISTED_SKIPS]],
    }
    return Output(data, text=out)


def _skipped_note(skipped: list[tuple[str, _Skip]]) -> str:
    count = len(skipped)
    head = f"[{count} file{'s' if count > 1 else ''} not searched"
    if count <= NAMED_SKIPS:
        return head + ": " + "; ".join(skip.detail for _, skip in skipped) + "]"
    kinds = Counter(skip.kind for _, skip in skipped)
    return head + ": " + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()) + "]"


def _files_under(
    roots: Roots, real: str, settings: FileSettings, ctx: ToolContext
) -> Iterator[tuple[str, str]]:
    if not os.path.isdir(real):
        yield roots.relative(real), real
        return
    for relative, _ in _walk(real, settings, ctx):
        full = os.path.join(real, relative)
        if os.path.islink(full):
            target = os.path.realpath(full)
            if not roots.contains(target) or not os.path.isfile(target):
                continue
            # Shown by its own name, read where it leads (files are opened without following
            # a final symlink, so the link itself would read as nothing).
            yield roots.relative(full), target
            continue
        yield roots.relative(full), full


def _search_file(
    roots: Roots, real: str, compiled: Any, settings: FileSettings, ctx: ToolContext
) -> list[tuple[int, str]] | _Skip:
    """Matching lines of one file, or why it is not searched (binary, too big, refused).
    Stops early once the call is cancelled or past its deadline: a slow pattern may take up to
    ``REGEX_SECONDS`` on each of a file's lines."""
    raw = _load(roots, real, settings)
    if isinstance(raw, _Skip):
        return raw
    text = raw.decode("utf-8", "replace")
    hits: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if ctx.cancelled:
            break
        try:
            found = compiled.search(line, timeout=REGEX_SECONDS)
        except TimeoutError:
            raise ValueError(
                f"the pattern took longer than {REGEX_SECONDS:g}s on one line of "
                f"{roots.relative(real)!r}; simplify it"
            ) from None
        if found:
            hits.append((number, line[:MAX_LINE_CHARS]))
            if len(hits) > settings.max_results:
                break
    return hits


def _load(roots: Roots, real: str, settings: FileSettings) -> bytes | _Skip:
    """The bytes of a file grep may search, or why it may not."""
    shown = roots.relative(real)
    limit = settings.max_file_bytes
    try:
        if roots.check_file(real) is None:
            return _Skip("gone before they were read", f"no file {shown!r}", FileNotFoundError)
        with roots.open(real, os.O_RDONLY) as fd:
            size = os.fstat(fd).st_size
            if size > limit:
                return _Skip(
                    f"larger than max_file_bytes ({limit} bytes)",
                    f"{shown!r} is {size} bytes, larger than grep's max_file_bytes ({limit})",
                )
            with os.fdopen(os.dup(fd), "rb") as handle:
                raw = handle.read()
    except HardLinked as exc:
        return _Skip(HARD_LINKED, str(exc), PathRefused)
    except PathRefused as exc:
        return _Skip("refused by a path rule", str(exc), PathRefused)
    except OSError as exc:
        return _Skip("unreadable", f"{shown!r} cannot be read: {exc.strerror or exc}", OSError)
    if b"\x00" in raw[:SNIFF_BYTES]:
        return _Skip("binary", f"{shown!r} is a binary file", quiet=True)
    return raw
