"""A cap on the processes of one call: a pids cgroup of its own.

RLIMIT_NPROC counts all the processes of a user, and the kernel does not apply it to root
(uid 0, root inside bubblewrap's user namespace too): for root it caps nothing. A pids cgroup
caps every process and thread inside it, whoever runs them. Each call with ``max_processes``
gets a fresh one with ``pids.max``; the child joins it between fork and exec, before it can
fork, and whatever it starts (a sandbox included) inherits it. When the call is over, what is
still inside is killed and the cgroup removed.

cgroup v2 is used when our own cgroup offers the pids controller to its children (delegated
to us; toolmesh never enables it), else the cgroup v1 pids hierarchy. Where neither is
writable there is no cap for root: one warning says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import re
import signal
import time
from dataclasses import dataclass

__all__ = ["PidsCgroup", "join", "pids_parent"]

log = logging.getLogger(__name__)

PREFIX = "toolmesh-"  # the name of each call's cgroup starts so
REMOVE_WAIT = 2.0  # seconds for killed processes to leave before the cgroup is abandoned
POLL = 0.005


@dataclass(frozen=True, slots=True)
class PidsCgroup:
    """One call's pids cgroup (``path``, a folder of a cgroup filesystem)."""

    path: str
    v2: bool

    @classmethod
    def create(cls, limit: int, name: str) -> PidsCgroup | None:
        """A new cgroup allowing ``limit`` tasks, or None where no pids cgroup is writable."""
        found = pids_parent()
        if found is None:
            return None
        parent, v2 = found
        path = os.path.join(parent, PREFIX + name)
        try:
            os.mkdir(path)
        except OSError as exc:  # asked for a cap that cannot be had now: run nothing
            raise RuntimeError(f"max_processes: no pids cgroup under {parent}: {exc}") from None
        try:
            _write(os.path.join(path, "pids.max"), str(limit))
        except OSError as exc:
            os.rmdir(path)
            raise RuntimeError(f"max_processes: cannot set {path}/pids.max: {exc}") from None
        return cls(path, v2)

    @property
    def procs(self) -> str:
        """The file a process writes its pid to, to join."""
        return os.path.join(self.path, "cgroup.procs")

    async def remove(self) -> None:
        """Kill what is still inside, then remove the cgroup (a killed process, or a sandbox
        whose first process just ended, takes a moment to leave)."""
        deadline = time.monotonic() + REMOVE_WAIT
        try:
            while not self._removed():
                if time.monotonic() > deadline:
                    log.warning("pids cgroup %s still has processes; left in place", self.path)
                    return
                self._kill_members()
                await asyncio.sleep(POLL)
        except asyncio.CancelledError:
            asyncio.get_running_loop().call_later(REMOVE_WAIT, self._removed)  # one more try
            raise

    def _removed(self) -> bool:
        """Whether it is gone (or cannot be removed: then say so, once)."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            log.warning("cannot remove the pids cgroup %s: %s", self.path, exc)
        return True

    def _kill_members(self) -> None:
        kill = os.path.join(self.path, "cgroup.kill")  # v2 since Linux 5.14: no pid races
        if self.v2 and os.path.exists(kill):
            with contextlib.suppress(OSError):
                _write(kill, "1")
            return
        with contextlib.suppress(OSError), open(self.procs) as handle:
            for line in handle:  # pids of our namespace; members only, so no stranger is hit
                with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                    os.kill(int(line), signal.SIGKILL)


def join(procs: str) -> None:
    """Move the calling process into the cgroup whose ``cgroup.procs`` is ``procs`` (run in the
    child between fork and exec: only plain system calls)."""
    _write(procs, str(os.getpid()))


@functools.cache
def pids_parent() -> tuple[str, bool] | None:
    """The cgroup folder under which calls get their pids cgroups, and whether it is v2; None
    (with one warning, for root) when there is none we may write."""
    mounts = _mounts()
    own = _own_cgroups()
    for v2, parent in ((True, _v2_parent(mounts, own)), (False, _v1_parent(mounts, own))):
        if parent is not None and _writable(parent):
            return parent, v2
    if os.geteuid() == 0:
        log.warning(
            "max_processes cannot be enforced: toolmesh runs as root, whom RLIMIT_NPROC does not "
            "limit, and no pids cgroup is writable here (cgroup v2 with the pids controller "
            "delegated, or the cgroup v1 pids hierarchy); processes are not capped"
        )
    return None


def _v2_parent(mounts: list[tuple[str, str, str, str]], own: dict[str, str]) -> str | None:
    """Our own v2 cgroup, when the pids controller is enabled for its children."""
    path = _cgroup_folder(mounts, "cgroup2", "", own.get(""))
    if path is None or "pids" not in _read(os.path.join(path, "cgroup.controllers")).split():
        return None
    # Only where it is enabled already: enabling it ourselves would change the cgroup tree for
    # every process sharing our cgroup (the whole machine, at the root).
    if "pids" not in _read(os.path.join(path, "cgroup.subtree_control")).split():
        return None
    return path


def _v1_parent(mounts: list[tuple[str, str, str, str]], own: dict[str, str]) -> str | None:
    """Our own cgroup in the v1 pids hierarchy."""
    return _cgroup_folder(mounts, "cgroup", "pids", own.get("pids"))


def _cgroup_folder(
    mounts: list[tuple[str, str, str, str]], kind: str, controller: str, own: str | None
) -> str | None:
    """Where our cgroup ``own`` (a path in the hierarchy) appears in a mount of that hierarchy."""
    if own is None:
        return None
    for fstype, root, point, options in mounts:
        if fstype != kind or (controller and controller not in options.split(",")):
            continue
        inside = os.path.relpath(own, root)
        if inside == "." or not inside.startswith(".."):
            folder = os.path.normpath(os.path.join(point, inside))
            if os.path.isdir(folder):
                return folder
    return None


def _own_cgroups() -> dict[str, str]:
    """Our cgroup in each hierarchy, by controller ("" for v2): /proc/self/cgroup."""
    found: dict[str, str] = {}
    for line in _read("/proc/self/cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            found.setdefault(name, path)
    return found


def _mounts() -> list[tuple[str, str, str, str]]:
    """(fstype, root, mount point, super options) of each cgroup mount: /proc/self/mountinfo."""
    found = []
    for line in _read("/proc/self/mountinfo").splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        tail = fields[fields.index("-") + 1 :]
        if len(fields) > 4 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((tail[0], _unescape(fields[3]), _unescape(fields[4]), tail[2]))
    return found


def _unescape(field: str) -> str:
    r"""mountinfo writes a space as \040 (and a tab, newline, backslash likewise)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _writable(parent: str) -> bool:
    """Whether we may make cgroups under ``parent``: make and remove one."""
    probe = os.path.join(parent, f"{PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except FileExistsError:
        pass
    except OSError:
        return False
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return True


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
