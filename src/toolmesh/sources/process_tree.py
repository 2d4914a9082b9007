"""Killing a process and everything it started, also what left its process group.

A child started in a session of its own (``start_new_session``) and marked with a token in its
environment (``MARK``) can be ended with all its descendants: its process group, the processes of
its session that moved to other groups (shells do, for jobs), the descendants of those that
started sessions of their own while their parents still live, and every process whose
environment still carries the token (a daemon that double-forked out of the session). A child
that is a subreaper (``PR_SET_CHILD_SUBREAPER``, as the Python worker's runner is) also keeps
the orphans of its descendants as its children, so they are found whatever they did. Linux
(/proc); elsewhere only the process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

__all__ = ["MARK", "kill_group", "kill_session", "new_token"]

MARK = "TOOLMESH_RUN"  # set in each child's environment, to find daemons that left its session


def new_token() -> str:
    """A token to mark one child's environment with (``{MARK: token}``)."""
    return os.urandom(8).hex()


def kill_group(pgid: int) -> bool:
    """SIGKILL a process group; whether there was anyone left in it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_session(
    sid: int | None, token: str = "", *, wait: float = 1.0, leader_last: bool = False
) -> None:
    """SIGKILL the process group ``sid``, every process still in session ``sid`` (those that
    moved to another group of it, as shells do for pipelines and jobs), their descendants, and
    every process whose environment carries ``token`` (daemons that left the session); then
    wait up to ``wait`` seconds until none of them runs any more. ``sid`` None: only the
    marked ones (and their descendants), for a child already reaped, whose id may be reused.

    ``leader_last``: the others first, and the leader ``sid`` once their parents reaped them
    (or ``wait`` passed), for a leader that reaps them (the Python worker's init, bwrap):
    killed with them, it would leave their zombies to the system's init, which may take its
    time. Not for a shell: it would run its next command as its children die."""
    # Found before any is killed: a process whose parent dies is handed to another (init, or
    # the worker's subreaper), and the link that made it a descendant is gone.
    members = _session_members(sid, token)
    if leader_last and sid is not None:
        others = [pid for pid in members if pid != sid]
        _kill(others)
        _wait_until(others, _unreaped, wait)
    if sid is not None:
        kill_group(sid)
    _kill(members)
    _wait_until(members, _running, wait)


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _wait_until(pids: list[int], pending: Callable[[int], bool], wait: float) -> None:
    """Wait up to ``wait`` seconds until ``pending`` is false for each of ``pids``."""
    until = time.monotonic() + wait
    while pids and time.monotonic() < until:
        pids = [pid for pid in pids if pending(pid)]
        if pids:
            time.sleep(0.001)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has ended: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def _unreaped(pid: int) -> bool:
    """Whether ``pid`` still runs, or has ended and waits for a parent other than this
    process (which reaps its own children itself) to reap it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2 :].split()  # state ppid ...
    if fields[:1] in ([b"Z"], [b"X"]):
        return len(fields) > 1 and int(fields[1]) != os.getpid()
    return True


def _session_members(sid: int | None, token: str = "") -> list[int]:
    """Processes of session ``sid``, the descendants of its processes that started sessions of
    their own (``setsid``) while their parents still live, and those marked with ``token``."""
    marker = f"{MARK}={token}".encode()
    parents: dict[int, int] = {}
    members: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # state ppid pgrp session ...
        if len(fields) > 3:
            parents[int(entry)] = int(fields[1])
            if int(fields[3]) == sid or (token and _marked(entry, marker)):
                members.add(int(entry))
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in members} - members
        members |= more
        grew = bool(more)
    members.discard(os.getpid())
    return sorted(members)


def _marked(pid: str, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return marker in handle.read().split(b"\x00")
    except OSError:
        return False
