"""Built-in tools that are safe to hand to a model: files, shell, HTTP and Python code.

``builtin_source(True, workspace=...)`` gives all ten with their safe defaults; a mapping
switches single tools off (``False``), on with defaults (``True``) or on with settings (a table)::

    builtin_source({"shell": {"allow": ["git", "ls"]}, "http_request": False}, workspace="ws")

Keys of the mapping besides the tool names: ``workspace`` (the folder the tools are confined
to; default ./workspace, created if missing), ``roots`` (more folders the file tools may reach),
``allow_hardlinks`` and ``default`` (False: tools not named stay off).

Modules: confine (paths), files/search/patch (file tools), commandline + shell (shell),
process + sandbox (limits and bubblewrap, shared by shell and python), python, web + htmltext
(http_request), settings (reading the tables).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from toolmesh.errors import ConfigError
from toolmesh.sources.base import Source
from toolmesh.sources.builtins.confine import Roots
from toolmesh.sources.builtins.files import (
    FileSettings,
    edit_file_tool,
    list_files_tool,
    read_file_tool,
    write_file_tool,
)
from toolmesh.sources.builtins.patch import apply_patch_tool
from toolmesh.sources.builtins.python import PythonSettings, python_tool
from toolmesh.sources.builtins.search import glob_tool, grep_tool
from toolmesh.sources.builtins.settings import load
from toolmesh.sources.builtins.shell import ShellSettings, shell_tool
from toolmesh.sources.builtins.web import HttpClients, HttpSettings, http_request_tool
from toolmesh.tools import Tool

__all__ = [
    "BUILTIN_NAMES",
    "DEFAULT_WORKSPACE",
    "BuiltinsSource",
    "builtin_source",
    "sources_from_manifest",
]

BUILTIN_NAMES = (
    "read_file",
    "write_file",
    "edit_file",
    "list_files",
    "glob",
    "grep",
    "apply_patch",
    "shell",
    "http_request",
    "python",
)
DEFAULT_WORKSPACE = "workspace"
_FILE_TOOLS = {
    "read_file": read_file_tool,
    "write_file": write_file_tool,
    "edit_file": edit_file_tool,
    "list_files": list_files_tool,
    "glob": glob_tool,
    "grep": grep_tool,
    "apply_patch": apply_patch_tool,
}
_GENERAL_KEYS = {"workspace", "roots", "allow_hardlinks", "default", "enabled"}


class BuiltinsSource(Source):
    """The built-in tools of one workspace."""

    def __init__(self, roots: Roots, tools: Sequence[Tool], clients: HttpClients | None) -> None:
        self.name = "builtins"
        self.roots = roots
        self._tools = list(tools)
        self._clients = clients

    @property
    def workspace(self) -> Path:
        return Path(self.roots.home)

    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def close(self) -> None:
        if self._clients is not None:
            await self._clients.aclose()


def builtin_source(
    builtins: bool | Mapping[str, Any] = True,
    *,
    workspace: str | Path | None = None,
    base_dir: Path | None = None,
    where: str = "builtins",
) -> BuiltinsSource:
    """The built-in tools chosen by ``builtins`` (see the module docstring), confined to
    ``workspace`` (or the mapping's ``workspace``, relative to ``base_dir``)."""
    table: Mapping[str, Any] = {} if builtins is True else builtins or {}
    if not isinstance(table, Mapping):
        raise ConfigError(
            f"{where}: expected true, false or a table, not {type(builtins).__name__}"
        )
    unknown = set(table) - set(BUILTIN_NAMES) - _GENERAL_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: unknown built-in {sorted(unknown)[0]!r} "
            f"(built-ins: {', '.join(BUILTIN_NAMES)})"
        )
    base = base_dir or Path.cwd()
    given = workspace or table.get("workspace") or DEFAULT_WORKSPACE
    roots_given = table.get("roots", ())
    if not isinstance(given, str | Path):
        raise ConfigError(f"{where}.workspace: expected a folder path, not {given!r}")
    if not isinstance(roots_given, list | tuple) or not all(
        isinstance(p, str | Path) for p in roots_given
    ):
        raise ConfigError(f"{where}.roots: expected a list of folder paths, not {roots_given!r}")
    folder = Path(given).expanduser()
    folder = folder if folder.is_absolute() else base / folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{where}: workspace {str(folder)!r} cannot be created: {exc}") from None
    extra = [p if Path(p).is_absolute() else base / p for p in roots_given]
    try:
        roots = Roots([folder, *extra], allow_hardlinks=bool(table.get("allow_hardlinks", False)))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    default_on = table.get("default", True)
    tools: list[Tool] = []
    clients: HttpClients | None = None
    for name in BUILTIN_NAMES:
        setting = table.get(name, default_on)
        if setting is False:
            continue
        if setting is not True and not isinstance(setting, Mapping):
            raise ConfigError(f"{where}.{name}: expected true, false or a table, not {setting!r}")
        options = None if setting is True else setting
        if name in _FILE_TOOLS:
            tools.append(_FILE_TOOLS[name](roots, load(FileSettings, options, f"{where}.{name}")))
        elif name == "shell":
            tools.append(shell_tool(roots, load(ShellSettings, options, f"{where}.shell")))
        elif name == "python":
            tools.append(python_tool(roots, load(PythonSettings, options, f"{where}.python")))
        else:
            tool, clients = http_request_tool(load(HttpSettings, options, f"{where}.http_request"))
            tools.append(tool)
    return BuiltinsSource(roots, tools, clients)


def sources_from_manifest(entry: Mapping[str, Any], *, base_dir: Path) -> list[Source]:
    """The ``[builtins]`` table of toolmesh.toml (``enabled = false`` switches all off)."""
    if entry.get("enabled", True) is False:
        return []
    return [builtin_source(entry, base_dir=base_dir, where="builtins")]
