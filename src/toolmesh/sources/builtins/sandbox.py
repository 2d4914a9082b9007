"""Isolation with bubblewrap (``bwrap``): what a sandboxed command sees of the host.

Inside the sandbox: the system folders read-only (/usr, /etc, ...; /etc/shadow masked), a fresh
/proc and /dev, a private empty /tmp, no network unless allowed, no capabilities, new user, PID,
IPC and UTS namespaces, and the roots in one of three views:

- ``read-only``: the roots as they are, unwritable;
- ``overlay``: the roots writable, but writes land in a throwaway layer (a kernel overlayfs
  mounted in a user namespace of its own, since bubblewrap 0.8 has no overlay option) and are
  gone when the call ends;
- ``read-write``: the roots themselves, writable (everything else stays read-only).

The sandbox dies with its parent (``--die-with-parent``) and its PID namespace dies with its
first process, so killing bwrap kills everything inside. When isolation is asked for and bwrap is
missing, nothing runs: ``SandboxUnavailable`` says how to install it.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["HELPER_PROCESSES", "INSTALL_HINT", "Sandbox", "SandboxUnavailable", "find_bwrap"]

INSTALL_HINT = (
    "install bubblewrap: `apt-get install bubblewrap` (Debian, Ubuntu), "
    "`dnf install bubblewrap` (Fedora), `apk add bubblewrap` (Alpine); "
    "or switch isolation off (isolation = 'none')"
)
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
MASKED = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")
HELPER_PROCESSES = 2  # bwrap and its init in the new PID namespace: not the command's to count


class SandboxUnavailable(RuntimeError):
    """Isolation was asked for but cannot be had here; nothing was run."""


def find_bwrap() -> str:
    """The path of bwrap, or ``SandboxUnavailable`` naming how to install it."""
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxUnavailable(
            f"isolation needs bubblewrap, which is not installed; {INSTALL_HINT}"
        )
    return found


@dataclass(slots=True)
class Sandbox:
    """One call's sandbox: ``wrap(argv)`` gives the command line; ``close()`` removes the
    overlay's throwaway layer."""

    roots: Sequence[str]
    cwd: str
    view: str = "overlay"
    network: bool = False
    read_only_paths: Sequence[str] = ()
    # (root as configured, root resolved) for roots reached through a symlink: the configured
    # spelling leads to the root inside too, as the path checks accept it
    aliases: Sequence[tuple[str, str]] = ()
    # writable folders besides the roots (a package's allow_write), bound after the read-only
    # paths, so that one inside a read-only path is writable too
    writable_paths: Sequence[str] = ()
    _scratch: str | None = field(default=None, init=False)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        bwrap = find_bwrap()
        command = [
            bwrap,
            "--die-with-parent",
            "--new-session",
            "--unshare-all",
            "--cap-drop",
            "ALL",
        ]
        if self.network:
            command.append("--share-net")
        command += _system_mounts()
        command += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108 - private
        for extra in self.read_only_paths:
            real = os.path.realpath(extra)
            command += ["--ro-bind-try", real, real]
        for extra in self.writable_paths:
            real = os.path.realpath(extra)
            command += ["--bind-try", real, real]
        overlays: list[tuple[str, str]] = []
        for root in self.roots:
            if self.view == "read-write":
                command += ["--bind", root, root]
            elif self.view == "read-only":
                command += ["--ro-bind", root, root]
            else:
                merged = self._layer_for(root, len(overlays))
                overlays.append((root, merged))
                command += ["--bind", merged, root]
        for given, real in self.aliases:
            if not _under_system_mount(given):  # (those are read-only: no link can be made)
                command += ["--symlink", real, given]
        command += ["--chdir", self.cwd, "--", *argv]
        if overlays:
            return _with_overlays(overlays, command)
        return command

    def _layer_for(self, root: str, index: int) -> str:
        if any(c in root for c in ",:\\") or "\n" in root:
            raise SandboxUnavailable(
                f"the overlay view cannot mount {root!r} (',', ':' or '\\' in the path); "
                "use view = 'read-only' or 'read-write'"
            )
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="toolmesh-overlay-")
        base = os.path.join(self._scratch, str(index))
        for part in ("upper", "work", "merged"):
            os.makedirs(os.path.join(base, part))
        return os.path.join(base, "merged")

    def close(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, onerror=_force_remove)
            self._scratch = None


def _under_system_mount(path: str) -> bool:
    return any(
        path == top or path.startswith(top + "/") for top in (*SYSTEM_PATHS, "/proc", "/dev")
    )


def _system_mounts() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in MASKED:
        if os.path.isfile(path):
            args += ["--ro-bind", "/dev/null", path]
    return args


def _with_overlays(overlays: list[tuple[str, str]], command: list[str]) -> list[str]:
    """Mount each overlay in a user+mount namespace of its own, then exec bwrap inside it.
    Paths travel as arguments, never inside the script text."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxUnavailable(
            "the overlay view needs `unshare` (util-linux); install it or use view = 'read-only'"
        )
    pairs: list[str] = []
    for root, merged in overlays:
        base = os.path.dirname(merged)
        pairs += [f"lowerdir={root},upperdir={base}/upper,workdir={base}/work", merged]
    script = (
        'while [ "$1" != -- ]; do mount -t overlay overlay -o "$1" "$2" || exit 125; shift 2; done'
        '; shift; exec "$@"'
    )
    return [
        unshare,
        "--user",
        "--map-root-user",
        "--mount",
        "--",
        "/bin/sh",
        "-c",
        script,
        "sh",
        *pairs,
        "--",
        *command,
    ]


def _force_remove(function: object, path: str, _exc: object) -> None:
    """rmtree's error hook: overlayfs leaves a mode-000 work folder behind."""
    parent = os.path.dirname(path)
    os.chmod(parent, stat.S_IRWXU)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, stat.S_IRWXU)
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)
