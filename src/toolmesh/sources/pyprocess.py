"""The python kind, isolated (seed 003): a tool package with its own dependencies.

The package is a folder with a ``pyproject.toml``. Its dependencies (``[project].dependencies``)
are installed into a virtual environment of its own, cached by a hash of what decides its
content (the dependency list, the Python version and interpreter), so a second start costs
nothing. The tool runs in that environment as a worker process (sources/worker.py) that imports
nothing of toolmesh; the package's code is imported from its folder (or its ``src/``), so edits
apply at the next start. The tool object is named by ``entry = "module:attr"`` (the manifest
entry, or ``[tool.toolmesh] entry`` in pyproject.toml; default ``<project name>:tools``) and is
a dict or object with ``name``, ``description``, ``parameters`` (JSON Schema) and
``execute(input)``, or a list of them::

    def execute(input):
        count = input["state"].get("context", {}).get("count", 0) + 1
        input["activity"]("progress", [{"op": "add", "path": "/count", "value": count}])
        return {"output": count,
                "state_update": [{"op": "add", "path": "/context/count", "value": count}]}

    tools = [{"name": "count", "description": "Count calls",
              "parameters": {"type": "object", "properties": {}}, "execute": execute}]

The in-process ``@tool`` function stays the light default; this kind is for tools whose
dependencies must not meet toolmesh's (or each other's).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

__all__ = ["PythonPackageSource", "ensure_venv", "sources_from_manifest"]

RUNNER = Path(__file__).resolve().parent / "runners" / "python_runner.py"


@dataclass(frozen=True)
class _Settings:
    """The types of PythonPackageSource's settings, checked as the built-ins check theirs: a
    wrong kind (``isolation = "bwrap"``, ``network = "false"``) is a ConfigError naming the
    setting, never a sandbox quietly left off."""

    entry: str | None
    name: str | None
    python: str | None
    isolation: Isolation
    network: bool
    env: Mapping[str, str] | None


class PythonPackageSource(WorkerSource):
    """The tools of one Python package, run in its own virtual environment."""

    kind = "python"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        entry: str | None = None,
        name: str | None = None,
        python: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        isolation: Isolation = "none",
        network: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.folder = Path(path).resolve()
        default_name = f"python:{self.folder.name}"
        given = {
            "entry": entry,
            "name": name,
            "python": python,
            "isolation": isolation,
            "network": network,
            "env": env,
        }
        settings = load(_Settings, given, default_name)
        super().__init__(settings.name or default_name)
        self.entry = settings.entry
        self.python = settings.python or sys.executable
        self.cache = Path(cache_dir) if cache_dir else cache_root() / "venvs"
        self.isolation = settings.isolation
        self.network = settings.network
        self.env = dict(settings.env or {})
        self.venv: Path | None = None

    async def prepare(self) -> None:
        pyproject = _read_pyproject(self.folder)
        self.entry = self.entry or _default_entry(pyproject, self.folder)
        dependencies = _table(pyproject, "project", self.folder).get("dependencies", [])
        if not isinstance(dependencies, list) or not all(isinstance(d, str) for d in dependencies):
            raise WorkerError(f"{self.name}: [project].dependencies must be a list of strings")
        self.venv = await self._ensure_venv(dependencies)

    async def _ensure_venv(self, dependencies: list[str]) -> Path:
        """``ensure_venv``, its commands run by ``run_setup``: a close or a cancelled open
        kills them (pip's builds with them) and removes the half-built environment."""

        async def step(argv: list[str], what: str, timeout: float | None) -> _Completed:
            return await self.run_setup(argv, what, timeout=timeout)

        return await _build_venv(dependencies, self.cache, self.python, step)

    def command(self) -> tuple[list[str], str, dict[str, str]]:
        if self.venv is None or self.entry is None:  # pragma: no cover - prepare() ran first
            raise WorkerError(f"{self.name}: not prepared")
        root = self.folder / "src" if (self.folder / "src").is_dir() else self.folder
        python = self.venv / "bin" / "python"
        argv = [str(python), "-I", "-B", str(RUNNER), str(root), self.entry]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            **self.env,
        }
        if self.isolation == "bubblewrap":
            base = Path(os.path.realpath(python)).parent.parent
            visible = [str(self.folder), str(RUNNER.parent), str(self.venv), str(base)]
            sandbox = Sandbox((), str(self.folder), view="read-only", network=self.network,
                              read_only_paths=visible)  # fmt: skip
            argv = sandbox.wrap(argv)
        return argv, str(self.folder), env


def _read_pyproject(folder: Path) -> dict[str, Any]:
    path = folder / "pyproject.toml"
    if not path.is_file():
        raise WorkerError(f"{folder} has no pyproject.toml")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise WorkerError(f"{path}: {exc}") from None


def _table(
    parent: Mapping[str, Any], key: str, folder: Path, *, within: str = ""
) -> Mapping[str, Any]:
    """``parent[key]``, a TOML table (empty when absent); a WorkerError when it is a value."""
    value = parent.get(key, {})
    if not isinstance(value, Mapping):
        raise WorkerError(f"{folder / 'pyproject.toml'}: `{within}{key}` must be a table")
    return value


def _default_entry(pyproject: Mapping[str, Any], folder: Path) -> str:
    toolmesh = _table(_table(pyproject, "tool", folder), "toolmesh", folder, within="tool.")
    configured = toolmesh.get("entry")
    if isinstance(configured, str):
        return configured
    name = _table(pyproject, "project", folder).get("name")
    if not isinstance(name, str):
        raise WorkerError(f'{folder}: set `entry = "module:attr"` (no [project].name to guess)')
    return re.sub(r"[-.]", "_", name).lower() + ":tools"


def ensure_venv(dependencies: list[str], cache: Path, python: str = sys.executable) -> Path:
    """The virtual environment with ``dependencies`` installed, made once per content hash.

    It is built in a temporary folder and renamed into place, so a half-made environment is
    never used, and two builders racing each other both end with a whole one."""

    async def step(argv: list[str], what: str, timeout: float | None) -> _Completed:
        return await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=timeout, check=False
        )

    return asyncio.run(_build_venv(dependencies, cache, python, step))


_Completed = subprocess.CompletedProcess[str]
_Step = Callable[[list[str], str, float | None], Awaitable[_Completed]]


async def _build_venv(dependencies: list[str], cache: Path, python: str, step: _Step) -> Path:
    """``ensure_venv``'s build, each command run by ``step(argv, what, timeout)``."""
    argv = _version_argv(python)
    asked = await step(argv, "asking Python its version", None)
    if asked.returncode != 0:
        raise subprocess.CalledProcessError(asked.returncode, argv, asked.stdout, asked.stderr)
    target = _venv_target(dependencies, cache, asked.stdout.strip())
    if (target / "bin" / "python").exists():
        return target
    os.makedirs(cache, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
    try:
        for command, what in _venv_steps(dependencies, building, python):
            done = await step(command, what, _STEP_TIMEOUT)
            if done.returncode != 0:
                raise WorkerError(_failed(what, done))
        _move_into_place(building, target)  # no await from here to the rename
    finally:
        await asyncio.to_thread(shutil.rmtree, building, True)
    return target


_STEP_TIMEOUT = 900  # seconds, for each command of a build


def _version_argv(python: str) -> list[str]:
    return [python, "-c", "import sys; print(sys.version, sys.base_prefix)"]


def _venv_target(dependencies: list[str], cache: Path, version: str) -> Path:
    """Where the environment of ``dependencies`` on the Python that said ``version`` lives."""
    key = json.dumps({"deps": sorted(dependencies), "python": version}, sort_keys=True)
    return cache / hashlib.sha256(key.encode()).hexdigest()[:20]


def _venv_steps(
    dependencies: list[str], building: Path, python: str
) -> list[tuple[list[str], str]]:
    """The commands that build the environment in ``building``, each with what it does."""
    steps = [([python, "-m", "venv", "--without-pip", str(building)], "creating the environment")]
    if dependencies:
        steps.append(
            (
                [
                    sys.executable, "-m", "pip", "--python", str(building / "bin" / "python"),
                    "install", "--quiet", "--disable-pip-version-check", *dependencies,
                ],
                "installing the dependencies",
            )
        )  # fmt: skip
    return steps


def _move_into_place(building: Path, target: Path) -> None:
    """The finished environment renamed to ``target`` (one step: only a whole one is there)."""
    _fix_paths(building, target)
    try:
        os.rename(building, target)
    except OSError:
        if not (target / "bin" / "python").exists():
            raise


def _fix_paths(building: Path, target: Path) -> None:
    """A venv records its own folder in activation scripts and script shebangs; point them at
    the final folder before the rename."""
    old, new = str(building).encode(), str(target).encode()
    for path in (building / "bin").iterdir():
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if old in data:
                path.write_bytes(data.replace(old, new))
    config = building / "pyvenv.cfg"
    config.write_bytes(config.read_bytes().replace(old, new))


def _failed(what: str, done: subprocess.CompletedProcess[str]) -> str:
    return f"{what} failed: {(done.stderr or done.stdout).strip()[-800:]}"


_OPTIONS = frozenset({"entry", "name", "python", "cache_dir", "isolation", "network", "env"})


def sources_from_manifest(entry: Mapping[str, Any], *, base_dir: Path) -> list[Source]:
    """A ``kind = "python"`` entry with ``path`` (an isolated package folder, relative to the
    manifest) and the options of ``PythonPackageSource`` (top level or in ``config``)."""
    folder, config = package_entry(entry, base_dir=base_dir, kind="python", options=_OPTIONS)
    return [PythonPackageSource(folder, **config)]
