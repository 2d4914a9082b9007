"""The javascript kind (seed 003): tools written as JavaScript or TypeScript packages.

A package is a folder with a ``package.json`` whose entry module (``main``, ``exports["."]``, or
index.{mjs,js,ts}) exports a tool, or a list of them, as ``default``, ``tool`` or ``tools``::

    export default {
      name: "counter",
      description: "Count calls",
      parameters: { type: "object", properties: { by: { type: "integer" } } },
      async execute({ args, state, activity }) {
        activity("progress", [{ op: "add", path: "/step", value: 1 }]);
        const update = [{ op: "add", path: "/context/n", value: args.by }];
        return { output: { n: args.by }, state_update: update };
      },
    };

It runs in Node.js as a worker process (sources/worker.py) under Node's permission model: it may
read its own package folder (and ``allow_read``), write only ``allow_write``, and start no child
processes or workers. Node's permissions check a path as written, not where its symbolic links
lead, so before each start of the worker the granted folders are searched for links that would
lead the tool past them (``node_modules`` included: npm's own links stay inside; a ``file:``
dependency, ``npm link`` or a store outside, as pnpm's global one, leads out): such a link fails
the start, naming it, until it is removed or its target granted too. Node's permissions do not
cover the network; ``isolation = "bubblewrap"`` adds a sandbox without network (unless
``network = true``), in which the ``allow_write`` folders are the only writable ones.
TypeScript entries are bundled with esbuild first (from the setting ``esbuild``,
$TOOLMESH_ESBUILD, the package's node_modules, or PATH), cached by the content of the package.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolmesh.capabilities import string_list
from toolmesh.sources.base import Source
from toolmesh.sources.builtins.sandbox import Sandbox
from toolmesh.sources.builtins.settings import load
from toolmesh.sources.worker import (
    Isolation,
    WorkerError,
    WorkerSource,
    cache_root,
    package_entry,
)

__all__ = ["JavaScriptSource", "sources_from_manifest"]

RUNNER = Path(__file__).resolve().parent / "runners" / "node_runner.mjs"
NODE_HINT = "install Node.js 20 or newer (`apt-get install nodejs`) or set `node` to its path"
TYPESCRIPT = (".ts", ".mts", ".cts", ".tsx")
_SKIP = {"node_modules", ".git", "dist", "build"}


@dataclass(frozen=True)
class _Settings:
    """The types of JavaScriptSource's settings, checked as the built-ins check theirs: a
    wrong kind (``isolation = "bwrap"``, ``network = "false"``) is a ConfigError naming the
    setting, never a sandbox quietly left off."""

    name: str | None
    node: str
    esbuild: str | None
    install: bool
    isolation: Isolation
    network: bool
    env: Mapping[str, str] | None


class JavaScriptSource(WorkerSource):
    """The tools of one JavaScript/TypeScript package, run by Node.js."""

    kind = "javascript"
    exact_integers_up_to = 2**53  # JSON numbers are doubles in JavaScript

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        node: str = "node",
        allow_read: Sequence[str] = (),
        allow_write: Sequence[str] = (),
        esbuild: str | None = None,
        install: bool = True,
        isolation: Isolation = "none",
        network: bool = False,
        env: Mapping[str, str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.folder = Path(path).resolve()
        default_name = f"javascript:{self.folder.name}"
        given = {
            "name": name,
            "node": node,
            "esbuild": esbuild,
            "install": install,
            "isolation": isolation,
            "network": network,
            "env": env,
        }
        settings = load(_Settings, given, default_name)
        super().__init__(settings.name or default_name)
        self.node = settings.node
        self.allow_read = [
            str(Path(p).resolve()) for p in string_list(allow_read, where="allow_read", paths=True)
        ]
        self.allow_write = [
            str(Path(p).resolve())
            for p in string_list(allow_write, where="allow_write", paths=True)
        ]
        self.esbuild = settings.esbuild
        self.install = settings.install
        self.isolation = settings.isolation
        self.network = settings.network
        self.env = dict(settings.env or {})
        # resolved, as the package and allow_* folders are: Node's read grant and the symlink
        # check name the bundle's folder by its real path
        self.cache = (Path(cache_dir) if cache_dir else cache_root() / "javascript").resolve()
        self.entry: Path | None = None
        self._permission_flag = "--experimental-permission"

    async def prepare(self) -> None:
        manifest = self.folder / "package.json"
        if not manifest.is_file():
            raise WorkerError(f"{self.name}: {self.folder} has no package.json")
        try:
            package = json.loads(manifest.read_text(encoding="utf-8-sig"))  # as Node: BOM ok
        except ValueError as exc:  # not JSON, or not UTF-8
            raise WorkerError(f"{self.name}: {manifest} is not valid JSON: {exc}") from None
        if not isinstance(package, dict):
            raise WorkerError(
                f"{self.name}: {manifest} must hold a JSON object, not {type(package).__name__}"
            )
        node = shutil.which(self.node)
        if node is None:
            raise WorkerError(f"{self.name}: Node.js ({self.node!r}) is not installed; {NODE_HINT}")
        self.node = node
        version = await self.run_setup([node, "--version"], "asking Node.js its version")
        self._permission_flag = _permission_flag(version.stdout)
        if (
            self.install
            and package.get("dependencies")
            and not (self.folder / "node_modules").exists()
        ):
            await self._npm_install()
        entry = _entry(self.folder, package)
        if entry.suffix in TYPESCRIPT:
            entry = await self._bundle(entry)
        self.entry = entry

    def _readable(self) -> list[str]:
        """What the worker may read: the runner, the package, its entry's folder (a bundle's
        is in the cache) and ``allow_read``."""
        if self.entry is None:  # pragma: no cover - prepare() ran first
            raise WorkerError(f"{self.name}: not prepared")
        return [str(RUNNER), str(self.folder), str(self.entry.parent), *self.allow_read]

    async def before_start(self) -> None:
        """No symbolic link in what the worker may read or write leads where it may not:
        Node would check the link's path, and let it through (one walk of those folders, at
        each start, since they may have changed)."""
        found = await asyncio.to_thread(_escaping_link, self._readable(), self.allow_write)
        if found is not None:
            link, target, missing = found
            verbs = " and ".join(sorted(missing))
            settings = " and ".join(f"allow_{verb}" for verb in sorted(missing))
            raise WorkerError(
                f"{self.name}: {link} is a symbolic link to {target}, which the tool may not "
                f"{verbs}; Node's permissions check the link, not where it leads, so it is "
                f"refused: remove it, or grant its target with {settings}"
            )

    def command(self) -> tuple[list[str], str, dict[str, str]]:
        readable = self._readable()
        argv = [self.node, "--no-warnings", self._permission_flag]
        argv += [f"--allow-fs-read={_grant(p)}" for p in _outermost(readable)]
        argv += [f"--allow-fs-write={_grant(p)}" for p in _outermost(self.allow_write)]
        argv += [str(RUNNER), str(self.entry)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", **self.env}
        if self.isolation == "bubblewrap":
            sandbox = Sandbox(
                (),
                str(self.folder),
                view="read-only",
                network=self.network,
                read_only_paths=[*readable, str(Path(self.node).resolve().parent.parent)],
                writable_paths=self.allow_write,
            )
            argv = sandbox.wrap(argv)
        return argv, str(self.folder), env

    async def _npm_install(self) -> None:
        npm = shutil.which("npm")
        if npm is None:
            raise WorkerError(f"{self.name}: the package has dependencies but npm is not installed")
        modules = self.folder / "node_modules"
        fresh = not modules.exists()
        try:
            done = await self.run_setup(
                [npm, "install", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund"],
                "installing its dependencies (npm install)",
                cwd=self.folder,
                timeout=600,
            )
        except BaseException:
            # Killed (a close, a cancelled open, the timeout): the node_modules it was making
            # is half made, and a later open would take it for an install and skip npm.
            aside = _set_aside(modules) if fresh else None
            if aside is not None:
                await asyncio.to_thread(shutil.rmtree, aside, True)
            raise
        if done.returncode != 0:
            raise WorkerError(f"{self.name}: npm install failed: {done.stderr.strip()[-500:]}")

    async def _bundle(self, entry: Path) -> Path:
        """The bundle of ``entry``, cached by the package's content: written under a name of
        its own (no other build writes it) and renamed into place once esbuild succeeded, so
        a killed or failed build leaves no file a later open would take for a bundle."""
        esbuild = self._find_esbuild()
        digest = await asyncio.to_thread(_content_hash, self.folder)
        target = self.cache / f"{self.folder.name}-{digest}.mjs"
        kept_meta = target.with_suffix(".meta.json")
        if target.is_file() and self._cached_bundle_fits(target, kept_meta):
            return target
        self.cache.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}-{secrets.token_hex(4)}.tmp.mjs")
        meta = partial.with_suffix(".meta.json")
        try:
            done = await self.run_setup(
                [
                    esbuild,
                    str(entry),
                    "--bundle",
                    "--platform=node",
                    "--format=esm",
                    "--log-level=error",
                    f"--outfile={partial}",
                    f"--metafile={meta}",
                ],
                "bundling it (esbuild)",
                cwd=self.folder,
                timeout=300,
            )
            if done.returncode != 0:
                raise WorkerError(f"{self.name}: esbuild failed: {done.stderr.strip()[-800:]}")
            inputs = _metafile_inputs(meta)
            if inputs is None:
                raise WorkerError(f"{self.name}: esbuild left no readable metafile at {meta}")
            self._check_bundled(inputs)
            # The metafile first: a bundle with none beside it is built again.
            os.replace(meta, kept_meta)
            os.replace(partial, target)
        except BaseException:  # failed, timed out, closed or cancelled
            partial.unlink(missing_ok=True)
            raise
        finally:
            meta.unlink(missing_ok=True)
        return target

    def _cached_bundle_fits(self, bundle: Path, meta: Path) -> bool:
        """Whether a cached bundle may be used as it is. The cache is keyed by the package's
        content only: its inputs are checked again against this source's grants (another
        source, granted more, may have built it), and one from outside the package that
        changed since (a granted folder's file) makes it stale. With no metafile beside it
        (a build of an earlier toolmesh), it is stale."""
        inputs = _metafile_inputs(meta)
        if inputs is None:
            return False
        paths = self._check_bundled(inputs)
        try:
            built = bundle.stat().st_mtime_ns
            return all(os.stat(path).st_mtime_ns <= built for path in paths)
        except OSError:  # an input gone since
            return False

    def _check_bundled(self, inputs: dict[str, Any]) -> list[str]:
        """Every file esbuild put in the bundle, checked to be one the tool may read. esbuild
        runs with the host's rights: an ``import`` of ``../../secret.txt`` (text is a loader
        esbuild has by default) would bake a file from outside into a bundle the tool reads."""
        readable = [os.path.realpath(p) for p in (str(self.folder), *self.allow_read)]
        paths: list[str] = []
        for name in inputs:
            if not isinstance(name, str) or ":" in name.split("/", 1)[0]:
                continue  # a namespaced input (``<stdin>``, ``data:...``): no file on disk
            path = os.path.realpath(self.folder / name)
            paths.append(path)
            if not any(
                path == root or path.startswith(root.rstrip("/") + "/") for root in readable
            ):
                raise WorkerError(
                    f"{self.name}: the TypeScript bundle would hold {path}, which the tool may "
                    "not read: move it into the package, or grant its folder with allow_read"
                )
        return paths

    def _find_esbuild(self) -> str:
        for candidate in (
            self.esbuild,
            os.environ.get("TOOLMESH_ESBUILD"),
            str(self.folder / "node_modules" / ".bin" / "esbuild"),
            shutil.which("esbuild"),
        ):
            if candidate and os.access(candidate, os.X_OK):
                return candidate
        raise WorkerError(
            f"{self.name}: a TypeScript entry needs esbuild: `npm install --save-dev esbuild` in "
            "the package, or set `esbuild` (or $TOOLMESH_ESBUILD) to its path"
        )


def _metafile_inputs(meta: Path) -> dict[str, Any] | None:
    """The ``inputs`` of an esbuild metafile, or None when it is missing or unreadable."""
    try:
        inputs = json.loads(meta.read_text())["inputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return inputs if isinstance(inputs, dict) else None


_CONDITIONS = frozenset({"import", "node", "default"})  # what Node's import() matches
_EXTENSIONS = ("", ".js", ".mjs", ".cjs", *TYPESCRIPT)


def _entry(folder: Path, package: Mapping[str, Any]) -> Path:
    exports = package.get("exports")
    if isinstance(exports, Mapping) and "." in exports:
        exports = exports["."]
    declared = _export_targets(exports)
    if isinstance(package.get("main"), str):
        declared.append(package["main"])
    candidates = [*declared, "index.mjs", "index.js", "index.ts", "src/index.ts", "src/index.js"]
    for relative in candidates:
        path = _resolve_file(folder, relative)
        if path is not None:
            return path
    if declared:  # a "main": "dist/index.js" not built yet, say: not "set 'main'"
        named = ", ".join(repr(relative) for relative in declared)
        raise WorkerError(
            f"{folder}: no entry module: package.json names {named}, but the package holds "
            "no such file (is it built?)"
        )
    raise WorkerError(f"{folder}: no entry module (set 'main' or 'exports' in package.json)")


def _export_targets(exports: Any) -> list[str]:
    """The paths an ``exports`` entry names, in Node's order: a string, a list of fallbacks,
    or conditions (``{"import": {"types": ..., "default": "./dist/index.mjs"}}``, nested)."""
    if isinstance(exports, str):
        return [exports]
    if isinstance(exports, list):
        return [target for item in exports for target in _export_targets(item)]
    if isinstance(exports, Mapping):
        return [
            target
            for condition, value in exports.items()
            if condition in _CONDITIONS
            for target in _export_targets(value)
        ]
    return []


def _resolve_file(folder: Path, relative: str) -> Path | None:
    """``relative`` as Node resolves a ``main``: the file itself, with an extension added
    (``"dist/index"``), or a folder's index (``"lib"``); only inside the package."""
    base = folder / relative
    tried = [Path(f"{base}{ext}") for ext in _EXTENSIONS]
    tried += [base / f"index{ext}" for ext in _EXTENSIONS[1:]]
    for candidate in tried:
        path = candidate.resolve()
        if path.is_file() and path.is_relative_to(folder):
            return path
    return None


def _outermost(paths: Sequence[str]) -> list[str]:
    """The paths without repeats or paths inside others (Node 20 crashes on a repeated grant)."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _escaping_link(
    readable: Sequence[str], writable: Sequence[str]
) -> tuple[str, str, set[str]] | None:
    """The first symbolic link in the granted paths (or a granted path that became one) that
    leads where the tool may not do what it may do where the link is, with its target and
    what it may not do there ("read", "write"); None when there is none."""
    for top in _outermost([*readable, *writable]):
        for link in _links_in(top):
            target = os.path.realpath(link)
            missing = _rights(link, readable, writable) - _rights(target, readable, writable)
            if missing:
                return link, target, missing
    return None


def _rights(path: str, readable: Sequence[str], writable: Sequence[str]) -> set[str]:
    """What Node lets the tool do at ``path`` (as written) with these grants."""

    def granted(grants: Sequence[str]) -> bool:
        return any(path == g or path.startswith(g.rstrip("/") + "/") for g in grants)

    return {verb for verb, grants in (("read", readable), ("write", writable)) if granted(grants)}


def _links_in(top: str) -> list[str]:
    """The symbolic links under ``top`` (``top`` itself when it is one), found without
    following any; folders that cannot be listed are skipped (Node cannot list them either)."""
    if os.path.islink(top):
        return [top]
    links: list[str] = []
    folders = [top]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        links.append(entry.path)
                    elif entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
        except OSError:  # a file, gone, or unreadable
            continue
    return links


def _grant(path: str) -> str:
    return path.rstrip("/") + "/*" if os.path.isdir(path) else path


def _permission_flag(version: str) -> str:
    """The permission flag of the Node.js that says ``version`` (``node --version``): Node
    20-22 call it --experimental-permission; later versions --permission."""
    try:
        major = int(version.strip().lstrip("v").split(".")[0])
    except ValueError:
        major = 20
    if major < 20:
        raise WorkerError(f"Node.js {version.strip()} has no permission model; {NODE_HINT}")
    return "--permission" if major >= 23 else "--experimental-permission"


def _set_aside(folder: Path) -> Path | None:
    """``folder`` renamed out of the way (in one step: nothing finds it half deleted) for
    deleting; None when there is none."""
    trash = folder.with_name(f".{folder.name}.discarded-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return None
    except OSError:
        return folder
    return trash


def _content_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP)
        for name in sorted(files):
            path = Path(root) / name
            digest.update(str(path.relative_to(folder)).encode() + b"\x00")
            digest.update(path.read_bytes() + b"\x00")
    return digest.hexdigest()[:16]


_OPTIONS = frozenset({
    "name", "node", "allow_read", "allow_write", "esbuild", "install", "isolation", "network",
    "env", "cache_dir",
})  # fmt: skip


def sources_from_manifest(entry: Mapping[str, Any], *, base_dir: Path) -> list[Source]:
    """A ``kind = "javascript"`` entry: ``path`` to the package folder (relative to the
    manifest) and the options of ``JavaScriptSource`` (top level or in ``config``)."""
    folder, config = package_entry(entry, base_dir=base_dir, kind="javascript", options=_OPTIONS)
    for key in ("allow_read", "allow_write"):  # a lone string is one folder, not its letters
        folders = string_list(config.get(key, []), where=f"kind 'javascript': {key}", paths=True)
        config[key] = [str(base_dir / p) for p in folders]
    return [JavaScriptSource(folder, **config)]
