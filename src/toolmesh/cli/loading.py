"""Turning command-line words into sources, hosts and connection targets."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolmesh.errors import ConfigError

__all__ = ["DEFAULT_AUDIT", "default_audit", "load_attr", "load_sources", "parse_target"]

DEFAULT_AUDIT = "toolmesh-audit.db"


def default_audit() -> str:
    """Where the commands keep the audit log when neither an option nor a manifest says:
    TOOLMESH_AUDIT, else DEFAULT_AUDIT."""
    return os.environ.get("TOOLMESH_AUDIT", DEFAULT_AUDIT)


_MODULE_ATTR = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def load_attr(spec: str) -> Any:
    """Import ``MODULE:ATTR`` (the current folder is importable) and return the attribute."""
    if not _MODULE_ATTR.match(spec):
        raise ConfigError(f"--tools wants MODULE:ATTR (for example mytools:toolkit), not {spec!r}")
    module_name, _, attr_path = spec.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    except (Exception, SystemExit) as exc:  # the module's own code failed (or called exit)
        raise ConfigError(f"importing {module_name!r} failed: {_named(exc)}") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{module_name!r} has no attribute {attr_path!r}") from None
    return target


def load_sources(specs: Sequence[str]) -> list[Any]:
    """The objects named by ``--tools`` specs, each a plugin, toolkit, tool, function or list."""
    return [_plugged(spec, load_attr(spec)) for spec in specs]


def _plugged(spec: str, found: Any) -> Any:
    """``found`` with its plugins made and their tools listed now, so that a plugin that
    fails says which spec it came from (the toolkit would otherwise fail with a traceback)."""
    from toolmesh.sources.plugin import PluginSource, ToolPlugin

    if isinstance(found, list | tuple):
        return [_plugged(spec, item) for item in found]
    if isinstance(found, type) and issubclass(found, ToolPlugin):
        try:
            found = found()
        except Exception as exc:
            raise ConfigError(f"cannot make a plugin of {spec}: {_named(exc)}") from exc
    if isinstance(found, ToolPlugin):
        try:
            return PluginSource(found)
        except Exception as exc:
            raise ConfigError(f"{spec} could not list its tools: {_named(exc)}") from exc
    from toolmesh.toolkit import as_source

    try:
        return as_source(found)  # as the toolkit would, but an object it cannot serve is named
    except ConfigError as exc:
        raise ConfigError(f"{spec}: {exc}") from None


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def parse_target(target: str, *, audit: str | None = None) -> Any:
    """A ``--target``: an http(s) URL, a MODULE:ATTR to serve in-process, or a command line.
    A MODULE:ATTR that is no Host or Toolkit is served as ``--tools`` would be, with the audit
    store ``audit`` (a Host or Toolkit keeps its own)."""
    from toolmesh.client import check_url, web_url

    url = web_url(target)
    if url is not None:
        check_url(url)
        return url
    if _MODULE_ATTR.match(target):
        from toolmesh.host import Host
        from toolmesh.toolkit import Toolkit

        found = load_attr(target)
        if isinstance(found, Host | Toolkit):
            return found
        # Anything --tools takes (a plugin, @tool function, list...): served as --tools would be
        return Host(_plugged(target, found), audit=audit)
    try:
        words = shlex.split(target)
    except ValueError as exc:  # an unbalanced quote, or a trailing backslash
        raise ConfigError(f"--target {target!r} cannot be read as a command: {exc}") from None
    if not words:
        raise ConfigError("--target is empty")
    if not Path(words[0]).exists() and not _on_path(words[0]):
        raise ConfigError(
            f"--target {target!r} is neither a URL, nor MODULE:ATTR, nor a command on PATH"
        )
    return words


def _on_path(program: str) -> bool:
    import shutil

    return shutil.which(program) is not None
