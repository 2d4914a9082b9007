"""Confining paths to a set of root folders.

Every path a model gives is checked the same way: it must be text without NUL bytes, within the
length limits, and once resolved (``realpath``: every symlink followed, ``..`` collapsed) it must
lie inside one of the roots. The check is repeated on the opened file descriptor
(``/proc/self/fd``), so a symlink swapped in between the check and the open is caught too. Files
with more than one hard link are refused: a hard link planted inside a root may alias a file
outside it, and nothing on disk says where its other names are.

The error messages say which rule refused the path, never where an escaping path leads.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from toolmesh.sources.builtins.base import Refused

__all__ = ["MAX_NAME", "MAX_PATH", "HardLinked", "PathRefused", "Roots"]

MAX_PATH = 4096  # bytes, PATH_MAX on Linux
MAX_NAME = 255  # bytes per path component, NAME_MAX


class PathRefused(Refused):
    """A path a tool may not touch; the message names the rule that refused it."""


class HardLinked(PathRefused):
    """A file refused for having more than one hard link (``allow_hardlinks`` admits it)."""

    def __init__(self, shown: str, links: int) -> None:
        super().__init__(
            f"{shown!r} has {links} hard links; it is refused because another link may lie "
            "outside the workspace"
        )


class Roots:
    """The folders the file tools may reach; the first is the working folder."""

    def __init__(self, roots: Sequence[str | os.PathLike[str]], *, allow_hardlinks: bool = False):
        if not roots:
            raise ValueError("at least one root folder is needed")
        resolved: list[str] = []
        aliases: list[tuple[str, str]] = []
        for root in roots:
            real = os.path.realpath(os.fspath(root))
            if not os.path.isdir(real):
                raise ValueError(f"root {os.fspath(root)!r} is not a folder")
            resolved.append(real)
            given = os.path.normpath(os.path.abspath(os.fspath(root)))
            if given != real:
                aliases.append((given, real))
        self.paths: tuple[str, ...] = tuple(resolved)
        # (as configured, resolved) for the roots a symlink leads to (macOS's /tmp, a linked
        # project folder): a model may spell an absolute path that way. Only the first, lexical
        # check of ``resolve`` admits these spellings; the resolved path must lie in ``paths``.
        self.aliases: tuple[tuple[str, str], ...] = tuple(aliases)
        self.allow_hardlinks = allow_hardlinks

    @property
    def home(self) -> str:
        """The working folder: relative paths start here."""
        return self.paths[0]

    def contains(self, real: str) -> bool:
        """Whether an already resolved path lies inside a root."""
        return any(_within(real, root) for root in self.paths)

    def relative(self, real: str) -> str:
        """How the model should see a resolved path: relative to the working folder when
        inside it, otherwise as is."""
        home = self.home
        if real == home:
            return "."
        if real.startswith(home.rstrip("/") + "/"):
            return real[len(home.rstrip("/")) + 1 :]
        return real

    def resolve(self, path: str, *, base: str | None = None) -> str:
        """The real path ``path`` names, refused unless it lies inside a root.

        ``base`` is the folder a relative path starts from (default: the working folder).
        The path need not exist; its nearest existing ancestor is resolved and must be inside.
        An absolute path may start with a root as resolved or as configured.
        """
        check_text(path)
        start = base or self.home
        joined = os.path.normpath(os.path.join(start, path or "."))
        if not self.contains(joined) and not any(_within(joined, a) for a, _ in self.aliases):
            if os.path.isabs(path):
                raise PathRefused(f"absolute path {path!r} is outside the workspace")
            raise PathRefused(f"path {path!r} uses '..' to leave the workspace")
        # Resolve the path as given, not ``joined``: the kernel follows a symlink before the
        # ``..`` after it ("link/.." is the parent of the link's target), normpath does not.
        real = os.path.realpath(os.path.join(start, path or "."))
        if not self.contains(real):
            raise PathRefused(_symlink_reason(path, joined, self))
        return real

    def check_file(self, real: str) -> os.stat_result | None:
        """``lstat`` of a resolved path (None when it does not exist), refusing hard links."""
        try:
            info = os.lstat(real)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            raise PathRefused(
                f"{self.relative(real)!r}: a parent is a file, not a folder"
            ) from None
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1 and not self.allow_hardlinks:
            raise HardLinked(self.relative(real), info.st_nlink)
        return info

    @contextmanager
    def open(self, real: str, flags: int, mode: int = 0o644) -> Iterator[int]:
        """Open a resolved regular file without following a final symlink (and without blocking
        on a FIFO), then check again where the descriptor really points (a symlink swapped in
        meanwhile is caught) and that it is a regular file."""
        fd = os.open(real, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
        try:
            self.verify_fd(fd, real)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PathRefused(f"{self.relative(real)!r} is not a regular file")
            os.set_blocking(fd, True)
            yield fd
        finally:
            os.close(fd)

    def verify_fd(self, fd: int, shown: str) -> None:
        where = os.readlink(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else shown
        if not self.contains(where):
            raise PathRefused(f"{self.relative(shown)!r} changed to point outside the workspace")
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1 and not self.allow_hardlinks:
            raise HardLinked(self.relative(shown), info.st_nlink)

    @contextmanager
    def open_folder(self, real: str) -> Iterator[int]:
        """Open a resolved folder without following a final symlink, then check where the
        descriptor really points (as ``open`` does for files)."""
        fd = self._open_folder(real, real)
        try:
            self.verify_fd(fd, real)
            yield fd
        finally:
            os.close(fd)

    def make_parents(self, real: str) -> None:
        """Create the missing folders above a resolved path.

        Each level is opened from the one above without following symlinks, and each missing
        folder is created relative to that descriptor, so a symlink swapped in meanwhile is
        refused instead of leading the creation out of the workspace.
        """
        parent = os.path.dirname(real)
        inside = [root for root in self.paths if _within(parent, root)]
        if not inside:
            raise PathRefused(f"{self.relative(parent)!r} is outside the workspace")
        root = max(inside, key=len)
        current = root
        fd = self._open_folder(root, root)
        try:
            self.verify_fd(fd, root)
            for name in Path(os.path.relpath(parent, root)).parts:
                if name == ".":
                    continue
                current = os.path.join(current, name)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fd)
                try:
                    child = self._open_folder(name, current, dir_fd=fd)
                except NotADirectoryError:
                    raise PathRefused(
                        f"{self.relative(current)!r} exists and is not a folder"
                    ) from None
                os.close(fd)
                fd = child
        finally:
            os.close(fd)

    def _open_folder(self, path: str, shown: str, *, dir_fd: int | None = None) -> int:
        # O_NOFOLLOW: a symlink in the folder's place fails to open (ENOTDIR on Linux, or ELOOP)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(path, flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP, errno.ENOENT):
                raise
            if os.path.islink(shown):
                raise PathRefused(f"{self.relative(shown)!r} changed to a symlink") from None
            if os.path.lexists(shown):
                raise NotADirectoryError(f"{self.relative(shown)!r} is not a folder") from None
            raise FileNotFoundError(f"no folder {self.relative(shown)!r}") from None


def _within(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip("/") + "/")


def check_text(path: object) -> None:
    """Refuse what is not a plain path string: wrong type, NUL bytes, over-long."""
    if not isinstance(path, str):
        raise PathRefused(f"a path must be a string, not {type(path).__name__}")
    if "\x00" in path:
        raise PathRefused("path contains a NUL byte")
    encoded = path.encode("utf-8", "surrogateescape")
    if len(encoded) >= MAX_PATH:
        raise PathRefused(f"path is too long ({len(encoded)} bytes; the limit is {MAX_PATH})")
    longest = max(
        (len(part.encode("utf-8", "surrogateescape")) for part in path.split("/")), default=0
    )
    if longest > MAX_NAME:
        raise PathRefused(
            f"a path component is too long ({longest} bytes; the limit is {MAX_NAME})"
        )


def _symlink_reason(path: str, joined: str, roots: Roots) -> str:
    """Name the symlink through which ``joined`` leaves the roots."""
    parts = Path(joined).parts
    current = Path(parts[0])
    for index, part in enumerate(parts[1:], start=1):
        current = current / part
        if os.path.islink(current) and not roots.contains(os.path.realpath(current)):
            shown = roots.relative(str(current))
            if index == len(parts) - 1:
                return f"{path!r} is a symlink that points outside the workspace"
            return (
                f"parent folder {shown!r} of {path!r} is a symlink that leads outside the workspace"
            )
    return f"path {path!r} resolves outside the workspace"
