"""The file tools: read_file, write_file, edit_file, list_files (capabilities fs::read, fs::write).

Every path goes through ``Roots`` (confine.py) before it is touched. Writes are atomic: the new
content goes to a temporary file in the same folder, is flushed to disk, and replaces the old
file in one ``rename``, all through a descriptor of the (checked) parent folder, so a reader sees
the old or the new file, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from toolmesh.sources.builtins.base import make_tool, schema
from toolmesh.sources.builtins.confine import Roots
from toolmesh.tools import Output, Tool, ToolContext, run_blocking

__all__ = [
    "FileSettings",
    "atomic_write",
    "capabilities_of",
    "edit_file_tool",
    "list_files_tool",
    "read_file_tool",
    "read_text",
    "write_file_tool",
]

READ = "fs::read"
WRITE = "fs::write"
SNIFF_BYTES = 8192


@dataclass(frozen=True, slots=True)
class FileSettings:
    """Limits of the file tools (each tool reads the ones it needs)."""

    # Text returned by one read_file call: under the pipeline's default output bound (200,000
    # characters), so a full page keeps its data and its "read on with offset=..." note.
    max_read_bytes: int = 192 * 1024
    max_lines: int = 2000  # lines returned by one read_file call when no limit is given
    max_write_bytes: int = 10 * 1024 * 1024
    max_entries: int = 1000  # list_files, glob
    max_results: int = 200  # grep matches
    max_file_bytes: int = 4 * 1024 * 1024  # grep skips larger files
    ignore: tuple[str, ...] = (".git", "node_modules", "__pycache__", ".venv")
    capabilities: tuple[str, ...] | None = None  # None: fs::read or fs::write


def capabilities_of(settings: FileSettings, default: str) -> tuple[str, ...]:
    return settings.capabilities if settings.capabilities is not None else (default,)


# -- read_file -----------------------------------------------------------------------------------


def read_file_tool(roots: Roots, settings: FileSettings) -> Tool:
    async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
        result: Output = await run_blocking(
            _read, roots, settings, args["path"], args.get("offset", 1), args.get("limit")
        )
        return result

    return make_tool(
        "read_file",
        "Read a text file of the workspace. `offset` is the first line to return (1-based), "
        "`limit` how many lines; long files come back in pages with a note saying how to go on. "
        "Binary files are described, not shown.",
        schema(
            ["path"],
            path={"type": "string", "description": "File path, relative to the workspace."},
            offset={"type": "integer", "minimum": 1, "description": "First line (1-based)."},
            limit={"type": "integer", "minimum": 1, "description": "How many lines."},
        ),
        run,
        capabilities=capabilities_of(settings, READ),
        idempotent=True,
    )


def _read(
    roots: Roots, settings: FileSettings, path: str, offset: int, limit: int | None
) -> Output:
    real = roots.resolve(path)
    shown = roots.relative(real)
    info = roots.check_file(real)
    if info is None:
        raise FileNotFoundError(f"no file {shown!r}")
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(f"{shown!r} is a folder; use list_files")
    limit = limit or settings.max_lines
    with roots.open(real, os.O_RDONLY) as fd, os.fdopen(os.dup(fd), "rb") as handle:
        head = handle.read(SNIFF_BYTES)
        if _looks_binary(head):
            size = os.fstat(fd).st_size
            data = {"path": shown, "binary": True, "size": size}
            return Output(data, text=f"{shown} is a binary file ({size} bytes); not shown")
        handle.seek(0)
        return _page(handle, shown, offset, limit, settings.max_read_bytes)


def _page(handle: Any, shown: str, offset: int, limit: int, max_bytes: int) -> Output:
    lines: list[str] = []
    used = number = 0
    stop = ""  # why the page ended before the file did: "lines" or "bytes"
    for number, raw in enumerate(_lines_cut_at(handle, max_bytes + 1), start=1):
        if number < offset:
            continue
        if len(lines) == limit:
            stop = "lines"
            break
        if used + len(raw) > max_bytes:
            stop = "bytes"
            if not lines:  # one line longer than the page: show its start
                lines.append(raw[:max_bytes].decode("utf-8", "replace") + "\n")
            break
        lines.append(raw.decode("utf-8", "replace"))
        used += len(raw)
    last = offset + len(lines) - 1
    text = "".join(lines)
    data: dict[str, Any] = {"path": shown, "start_line": offset, "end_line": last, "content": text}
    if stop:
        data["more"] = True
        reason = f"{max_bytes} bytes" if stop == "bytes" else f"{limit} lines"
        text += (
            f"[showing lines {offset}-{last} (page limit {reason}); read on with offset={last + 1}]"
        )
    else:
        data["total_lines"] = number
        if offset > max(number, 1):
            text = f"[{shown} has {number} lines; offset {offset} is past the end]"
    return Output(data, text=text)


def _lines_cut_at(handle: Any, cap: int) -> Iterator[bytes]:
    """The lines of ``handle``, each cut to its first ``cap`` bytes: iterating a file reads a
    whole line into memory, and one line can be the whole of a huge file."""
    while line := handle.readline(cap):
        if len(line) == cap and not line.endswith(b"\n"):
            while (rest := handle.readline(cap)) and not rest.endswith(b"\n"):
                pass  # skip the rest of the long line, a bounded piece at a time
        yield line


def _looks_binary(head: bytes) -> bool:
    if b"\x00" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 4  # a character cut at the sniff boundary is fine
    return False


def read_text(roots: Roots, real: str, max_bytes: int) -> str:
    """The whole UTF-8 text of a resolved file (for edits and patches)."""
    with roots.open(real, os.O_RDONLY) as fd:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise ValueError(f"{roots.relative(real)!r} is larger than {max_bytes} bytes")
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read()
    if b"\x00" in raw[:SNIFF_BYTES]:
        raise ValueError(f"{roots.relative(real)!r} is a binary file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{roots.relative(real)!r} is not UTF-8 text") from None


# -- write_file ----------------------------------------------------------------------------------


def write_file_tool(roots: Roots, settings: FileSettings) -> Tool:
    async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
        result: Output = await run_blocking(_write, roots, settings, args["path"], args["content"])
        return result

    return make_tool(
        "write_file",
        "Write a text file of the workspace, replacing it whole (missing folders are created). "
        "The file changes atomically: readers see the old or the new content, never a mix.",
        schema(
            ["path", "content"],
            path={"type": "string", "description": "File path, relative to the workspace."},
            content={"type": "string", "description": "The complete new content."},
        ),
        run,
        capabilities=capabilities_of(settings, WRITE),
    )


def _write(roots: Roots, settings: FileSettings, path: str, content: str) -> Output:
    data = content.encode("utf-8")
    if len(data) > settings.max_write_bytes:
        raise ValueError(f"content is {len(data)} bytes; the limit is {settings.max_write_bytes}")
    real = roots.resolve(path)
    shown = roots.relative(real)
    info = roots.check_file(real)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(f"{shown!r} is a folder")
    roots.make_parents(real)
    created = info is None
    atomic_write(roots, real, data)
    verb = "created" if created else "replaced"
    return Output(
        {"path": shown, "bytes": len(data), "created": created},
        text=f"{verb} {shown} ({len(data)} bytes)",
    )


def atomic_write(roots: Roots, real: str, data: bytes) -> None:
    """Replace the resolved file ``real`` with ``data`` in one rename inside its folder."""
    folder, name = os.path.split(real)
    dir_fd = _checked_folder(roots, folder)
    try:
        mode = 0o644
        with contextlib.suppress(FileNotFoundError):
            # the permission bits only: a set-user-ID or set-group-ID bit kept on a new file
            # (owned by toolmesh's user, root perhaps) would run the model's content as that user
            mode = stat.S_IMODE(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            mode &= 0o777
        # 255 bytes is the longest name: the name's start is cut by bytes, not characters
        stem = os.fsencode(name)[:200].decode("utf-8", "ignore")
        temp = f".{stem}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def checked_unlink(roots: Roots, real: str) -> None:
    """Delete the resolved file ``real`` through its checked folder: a folder on the way that
    is swapped for a symlink after the check cannot send the deletion outside the roots."""
    folder, name = os.path.split(real)
    dir_fd = _checked_folder(roots, folder)
    try:
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _checked_folder(roots: Roots, folder: str) -> int:
    """A descriptor of ``folder``, opened without following a final symlink and verified to
    lie in the roots (the caller closes it)."""
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        roots.verify_fd(dir_fd, folder)
    except BaseException:
        os.close(dir_fd)
        raise
    return dir_fd


# -- edit_file -----------------------------------------------------------------------------------


def edit_file_tool(roots: Roots, settings: FileSettings) -> Tool:
    async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
        result: Output = await run_blocking(
            _edit,
            roots,
            settings,
            args["path"],
            args["old"],
            args["new"],
            bool(args.get("replace_all", False)),
        )
        return result

    return make_tool(
        "edit_file",
        "Replace exact text in a file of the workspace. `old` must occur exactly once (give "
        "enough surrounding text to make it unique) unless `replace_all` is true.",
        schema(
            ["path", "old", "new"],
            path={"type": "string", "description": "File path, relative to the workspace."},
            old={"type": "string", "minLength": 1, "description": "The exact text to replace."},
            new={"type": "string", "description": "The text to put in its place."},
            replace_all={"type": "boolean", "description": "Replace every occurrence."},
        ),
        run,
        capabilities=capabilities_of(settings, WRITE),
    )


def _edit(
    roots: Roots, settings: FileSettings, path: str, old: str, new: str, replace_all: bool
) -> Output:
    real = roots.resolve(path)
    shown = roots.relative(real)
    if roots.check_file(real) is None:
        raise FileNotFoundError(f"no file {shown!r}")
    text = read_text(roots, real, settings.max_write_bytes)
    count = text.count(old)
    if count == 0:
        raise ValueError(f"the text to replace does not occur in {shown!r}")
    if count > 1 and not replace_all:
        raise ValueError(
            f"the text to replace occurs {count} times in {shown!r}; include more surrounding "
            "text to make it unique, or set replace_all"
        )
    if old == new:
        raise ValueError("old and new are the same text; nothing to change")
    atomic_write(roots, real, text.replace(old, new).encode("utf-8"))
    plural = "s" if count > 1 else ""
    return Output(
        {"path": shown, "replacements": count},
        text=f"edited {shown}: {count} replacement{plural}",
    )


# -- list_files ----------------------------------------------------------------------------------


def list_files_tool(roots: Roots, settings: FileSettings) -> Tool:
    async def run(args: dict[str, Any], ctx: ToolContext) -> Output:
        result: Output = await run_blocking(_list, roots, settings, args.get("path") or ".")
        return result

    return make_tool(
        "list_files",
        "List a folder of the workspace (default: its top). Folders end with '/'.",
        schema(path={"type": "string", "description": "Folder path, relative to the workspace."}),
        run,
        capabilities=capabilities_of(settings, READ),
        idempotent=True,
    )


def _list(roots: Roots, settings: FileSettings, path: str) -> Output:
    real = roots.resolve(path)
    shown = roots.relative(real)
    # List through a descriptor checked like read_file's, not by path: a symlink swapped in
    # after the check is not followed (O_NOFOLLOW) or is caught on the descriptor.
    with roots.open_folder(real) as fd, os.scandir(fd) as found:
        items = sorted(found, key=lambda e: e.name)
        # entries stat relative to the descriptor: read their kinds while it is open
        kinds = [_kind(entry) for entry in items[: settings.max_entries]]
    entries: list[dict[str, Any]] = []
    lines: list[str] = []
    for entry, (kind, size) in zip(items, kinds, strict=False):
        entries.append({"name": entry.name, "type": kind, "size": size})
        suffix = {"dir": "/", "symlink": "@"}.get(kind, "")
        lines.append(entry.name + suffix + (f"  ({size} bytes)" if kind == "file" else ""))
    data: dict[str, Any] = {"path": shown, "entries": entries}
    if len(items) > settings.max_entries:
        data["more"] = len(items) - settings.max_entries
        lines.append(f"[{data['more']} more entries not shown]")
    return Output(data, text="\n".join(lines) if lines else f"{shown} is empty")


def _kind(entry: os.DirEntry[str]) -> tuple[str, int | None]:
    try:
        if entry.is_symlink():
            return "symlink", None
        if entry.is_dir():
            return "dir", None
        if entry.is_file():
            return "file", entry.stat().st_size
    except OSError:
        pass
    return "other", None
