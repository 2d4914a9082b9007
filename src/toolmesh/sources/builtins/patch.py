"""apply_patch: a unified diff applied to the workspace, all of it or none of it (fs::write).

Every hunk of every file is matched and applied in memory first; only when all of them fit are
the files written (each atomically), and if a write fails the files already written are put back.
A hunk matches where its header says, or the nearest place above or below where its context and
removed lines appear exactly (as ``patch`` does with an offset, but without fuzz). Files are
created from ``/dev/null`` and deleted to ``/dev/null``; git headers are accepted, renames,
copies and binary patches are refused.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any

from toolmesh.sources.builtins.base import make_tool, schema
from toolmesh.sources.builtins.confine import Roots
from toolmesh.sources.builtins.files import (
    WRITE,
    FileSettings,
    atomic_write,
    capabilities_of,
    checked_unlink,
    read_text,
)
from toolmesh.tools import Output, Tool, ToolContext, run_blocking

__all__ = ["PatchError", "apply_patch_tool", "parse_patch"]

DEV_NULL = "/dev/null"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_TOLERATED = (
    "diff --git ",
    "index ",
    "new file mode ",
    "deleted file mode ",
    "old mode ",
    "new mode ",
    "similarity index ",
)
_REFUSED = (
    "rename from ",
    "rename to ",
    "copy from ",
    "copy to ",
    "GIT binary patch",
    "Binary files ",
)


class PatchError(ValueError):
    """A patch that cannot be read or does not apply; nothing was changed."""


@dataclass(slots=True)
class Hunk:
    old_start: int
    old: list[str] = field(default_factory=list)  # context and removed lines, no line endings
    new: list[str] = field(default_factory=list)  # context and added lines
    old_eof_newline: bool = True  # False after "\ No newline at end of file" on the old side
    new_eof_newline: bool = True


@dataclass(slots=True)
class FilePatch:
    old_path: str
    new_path: str
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.old_path if self.new_path == DEV_NULL else self.new_path


def parse_patch(text: str) -> list[FilePatch]:
    """The file patches of a unified diff."""
    lines = text.splitlines()
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(_REFUSED):
            raise PatchError(f"line {i + 1}: {line.split(' ')[0]!r} patches are not supported")
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(FilePatch(*_paths(line[4:], lines[i + 1][4:])))
            i += 2
            while i < len(lines) and lines[i].startswith("@@"):
                i = _read_hunk(lines, i, files[-1])
            if not files[-1].hunks:
                raise PatchError(f"line {i + 1}: file {files[-1].path!r} has no hunks")
            continue
        if line.startswith("@@"):
            raise PatchError(f"line {i + 1}: a hunk before any '---'/'+++' file header")
        i += 1  # commentary, git headers (_TOLERATED) and blank lines between files
    if not files:
        raise PatchError("no file changes found; expected a unified diff ('--- a/x', '+++ b/x')")
    seen: set[str] = set()
    for patch in files:
        if patch.path in seen:
            raise PatchError(f"file {patch.path!r} appears twice in the patch")
        seen.add(patch.path)
    return files


def _paths(old: str, new: str) -> tuple[str, str]:
    old, new = _clean(old), _clean(new)
    if old == DEV_NULL and new == DEV_NULL:
        raise PatchError("both sides of a file header are /dev/null")
    prefixed = all(p == DEV_NULL or p.startswith(("a/", "b/")) for p in (old, new))
    if prefixed:
        old = old if old == DEV_NULL else old[2:]
        new = new if new == DEV_NULL else new[2:]
    if DEV_NULL not in (old, new) and old != new:
        raise PatchError(f"renaming {old!r} to {new!r} is not supported")
    return old, new


def _clean(raw: str) -> str:
    path = raw.split("\t", 1)[0].rstrip()
    if path.startswith('"') and path.endswith('"') and len(path) > 1:
        path = path[1:-1]
    if not path:
        raise PatchError("a file header names no file")
    return path


def _read_hunk(lines: list[str], i: int, patch: FilePatch) -> int:
    match = _HUNK.match(lines[i])
    if match is None:
        raise PatchError(f"line {i + 1}: malformed hunk header {lines[i]!r}")
    old_left = int(match.group(2) or "1")
    new_left = int(match.group(4) or "1")
    hunk = Hunk(old_start=int(match.group(1)))
    i += 1
    last = ""
    while old_left > 0 or new_left > 0:
        if i >= len(lines):
            raise PatchError(f"hunk at line {match.group(0)!r} ends early (the patch is cut short)")
        line = lines[i]
        tag, body = (line[:1], line[1:]) if line else (" ", "")
        if tag == " ":
            hunk.old.append(body)
            hunk.new.append(body)
            old_left, new_left = old_left - 1, new_left - 1
        elif tag == "-":
            hunk.old.append(body)
            old_left -= 1
        elif tag == "+":
            hunk.new.append(body)
            new_left -= 1
        elif tag == "\\":
            _no_newline(hunk, last)
        else:
            raise PatchError(f"line {i + 1}: unexpected {line!r} inside a hunk")
        if old_left < 0 or new_left < 0:
            raise PatchError(f"line {i + 1}: the hunk has more lines than its header says")
        last = tag
        i += 1
    if i < len(lines) and lines[i].startswith("\\"):
        _no_newline(hunk, last)
        i += 1
    patch.hunks.append(hunk)
    return i


def _no_newline(hunk: Hunk, last: str) -> None:
    if last in (" ", "-"):
        hunk.old_eof_newline = False
    if last in (" ", "+"):
        hunk.new_eof_newline = False


# -- applying ------------------------------------------------------------------------------------


def apply_to_text(original: str | None, patch: FilePatch) -> str | None:
    """The new text of one file (None: the file is deleted)."""
    ending = "\r\n" if original and "\r\n" in original else "\n"
    lines = (original or "").splitlines()
    trailing = not original or original.endswith(("\n", "\r"))
    out: list[str] = []
    cursor = 0  # next unconsumed line of the original
    shift = 0
    for number, hunk in enumerate(patch.hunks, start=1):
        start = _locate(lines, hunk, cursor, shift)
        if start is None:
            raise PatchError(
                f"hunk {number} of {patch.path!r} does not apply: its context and removed lines "
                f"were not found near line {hunk.old_start}"
            )
        shift = start - (hunk.old_start - 1 if hunk.old else hunk.old_start)
        out.extend(lines[cursor:start])
        out.extend(hunk.new)
        cursor = start + len(hunk.old)
        if cursor >= len(lines):
            trailing = hunk.new_eof_newline if hunk.new else trailing
        elif not hunk.old_eof_newline:
            raise PatchError(f"hunk {number} of {patch.path!r} marks an end of file too early")
    out.extend(lines[cursor:])
    if patch.new_path == DEV_NULL:
        if out:
            raise PatchError(f"{patch.path!r} is deleted by the patch but keeps lines after it")
        return None
    text = ending.join(out)
    return text + ending if out and trailing else text


def _locate(lines: list[str], hunk: Hunk, cursor: int, shift: int) -> int | None:
    size = len(hunk.old)
    if size == 0:  # pure insertion: the header's line is where it goes
        return min(max(hunk.old_start + shift, cursor), len(lines))
    expected = max(hunk.old_start - 1 + shift, cursor)
    for distance in range(len(lines) + 1):
        for where in (expected - distance, expected + distance) if distance else (expected,):
            if cursor <= where <= len(lines) - size and lines[where : where + size] == hunk.old:
                return where
    return None


def apply_patch_text(roots: Roots, settings: FileSettings, text: str) -> list[dict[str, Any]]:
    """Apply a patch to the workspace, all or nothing; what happened to each file."""
    patches = parse_patch(text)
    plans: list[tuple[FilePatch, str, str | None, str | None]] = []
    planned: dict[str, str] = {}  # real path -> the name the patch gave it first
    for patch in patches:
        real = roots.resolve(patch.path)
        _refuse_second_name(planned, real, patch.path)
        exists = roots.check_file(real) is not None
        if patch.old_path == DEV_NULL and exists:
            raise PatchError(f"{patch.path!r} already exists; the patch would create it")
        if patch.old_path != DEV_NULL and not exists:
            raise PatchError(f"{patch.path!r} does not exist")
        original = read_text(roots, real, settings.max_write_bytes) if exists else None
        plans.append((patch, real, original, apply_to_text(original, patch)))
    done: list[tuple[str, str | None]] = []
    try:
        for _patch, real, original, new in plans:
            if new is None:
                checked_unlink(roots, real)
            else:
                roots.make_parents(real)
                atomic_write(roots, real, new.encode("utf-8"))
            done.append((real, original))
    except BaseException:
        _restore(roots, done)
        raise
    return [_report(roots, patch, real, original, new) for patch, real, original, new in plans]


def _refuse_second_name(planned: dict[str, str], real: str, name: str) -> None:
    """Refuse a file the patch already changes under another name ("a.txt" and "./a.txt", or a
    symlink to it): both changes would be made to the original text, and the second write
    would undo the first."""
    first = planned.get(real)
    if first is not None:
        raise PatchError(
            f"{name!r} and {first!r} name the same file; give all of its hunks under one name"
        )
    planned[real] = name


def _restore(roots: Roots, done: list[tuple[str, str | None]]) -> None:
    for real, original in reversed(done):
        with contextlib.suppress(OSError):
            if original is None:
                checked_unlink(roots, real)
            else:
                atomic_write(roots, real, original.encode("utf-8"))


def _report(
    roots: Roots, patch: FilePatch, real: str, original: str | None, new: str | None
) -> dict[str, Any]:
    action = "deleted" if new is None else "created" if original is None else "modified"
    return {"path": roots.relative(real), "action": action, "hunks": len(patch.hunks)}


def apply_patch_tool(roots: Roots, settings: FileSettings) -> Tool:
    async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
        files: list[dict[str, Any]] = await run_blocking(
            apply_patch_text, roots, settings, args["patch"]
        )
        summary = "\n".join(f"{f['action']} {f['path']} ({f['hunks']} hunks)" for f in files)
        return Output({"files": files}, text=summary)

    return make_tool(
        "apply_patch",
        "Apply a unified diff (as `diff -u` or `git diff` print it) to files of the workspace. "
        "All hunks apply or none do. Create a file with '--- /dev/null', delete one with "
        "'+++ /dev/null'.",
        schema(["patch"], patch={"type": "string", "minLength": 1, "description": "Unified diff."}),
        run,
        capabilities=capabilities_of(settings, WRITE),
    )
