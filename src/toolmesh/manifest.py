"""The ``toolmesh.toml`` manifest: a whole toolkit declared in one file.

::

    [toolkit]                 # name, capabilities, capability_policy, audit, on_conflict,
                              # skills_dir, store (sqlite:///PATH or postgresql://...)
    [builtins]                # the built-in tools' settings (toolmesh.sources.builtins)
    [[tools]]                 # one entry per tool or source
    kind = "python"           # python | javascript | bash | mcp | a2a | http | openapi
    enabled = true            # false: skipped
    capabilities = ["..."]    # required of callers, added to every tool of the entry
    prefix = "gh"             # names become gh_<name>
    placement = "ray"         # run the entry's tools as Ray tasks (``ray = {...}``: options)
    allow = ["glob"]          # keep only matching tool names (before the prefix); deny = [...]
    config = { }              # kind-specific settings; they may also sit beside kind
    [mcpServers.NAME]         # MCP servers in the Claude Desktop shape (also [servers], [mcp])
    [agents.KEY]              # remote A2A agents

The loader checks the shared keys and applies ``enabled``, ``allow``/``deny`` (``Filtered``),
``prefix`` (``Prefixed``) and ``capabilities`` (``Tagged``) itself. Everything else belongs to
the kind: the loader imports the kind's module only when an entry needs it and calls its
``sources_from_manifest(entry, *, base_dir)``, with ``entry`` one flat mapping (the entry's own
keys, ``config`` merged in, the shared keys taken out) and ``base_dir`` the manifest's folder.
A kind whose module is not installed is an error naming the kind.

Every error names its place: ``toolmesh.toml: line 3, column 9: ...`` for TOML syntax,
``toolmesh.toml: tools[2] (kind "mcp"): ...`` or ``toolmesh.toml: toolkit.audit: ...`` for the
rest. Sources are added in this order (the first to claim a name keeps it): ``[[tools]]`` in
file order, ``[builtins]``, ``skills_dir``, the MCP server tables, ``[agents]``.
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolmesh.capabilities import check_tag
from toolmesh.errors import ConfigError
from toolmesh.policy import Policy
from toolmesh.sources.base import Source
from toolmesh.sources.wrappers import Filtered, Prefixed, Tagged

if TYPE_CHECKING:
    from toolmesh.capabilities import CapabilityPolicy
    from toolmesh.pipeline import Limits
    from toolmesh.search import SearchMode
    from toolmesh.store import Store
    from toolmesh.toolkit import OnConflict, SourceLike, Toolkit

__all__ = ["KIND_MODULES", "Manifest", "load_manifest", "python_sources"]

SourcesFunction = Callable[..., list[Source]]

KIND_MODULES: dict[str, str] = {
    "javascript": "toolmesh.sources.javascript",
    "bash": "toolmesh.sources.builtins.shell",
    "mcp": "toolmesh.mcp.config",
    "a2a": "toolmesh.a2a.config",
    "http": "toolmesh.sources.http",
    "openapi": "toolmesh.sources.openapi",
}
"""Where each kind's ``sources_from_manifest`` lives (python is handled below)."""
PYTHON_PACKAGE_MODULE = "toolmesh.sources.pyprocess"  # kind python with path = "./folder"
BUILTINS_MODULE = "toolmesh.sources.builtins"  # the [builtins] table
KINDS = ("python", *KIND_MODULES)

_SHARED_KEYS = frozenset(
    {"kind", "enabled", "capabilities", "prefix", "allow", "deny", "config", "placement", "ray"}
)
_OWN_PREFIX = frozenset({"mcp"})
"""Kinds that already name their tools ``<prefix>_<tool>`` (an MCP server's name by default):
the entry's ``prefix`` replaces theirs instead of being added in front of it."""
_TOOLKIT_KEYS = frozenset(
    {
        "name",
        "capabilities",
        "capability_policy",
        "audit",
        "on_conflict",
        "skills_dir",
        "store",
        "search",
        "tool_search",
        "defer_above",
        "keep_active",
    }
)
PLACEMENT_MODULE = "toolmesh.sources.ray"  # placement = "ray"
_MCP_TABLES = ("mcpServers", "servers", "mcp")
_TABLES = frozenset({"toolkit", "builtins", "tools", "agents", "policy", *_MCP_TABLES})
_TOML_POSITION = re.compile(r"^(?P<message>.*) \(at line (?P<line>\d+), column (?P<column>\d+)\)$")
_MODULE_ATTR = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass
class Manifest:
    """A loaded manifest: the ``[toolkit]`` settings and the sources it declares."""

    path: Path
    sources: list[Source] = field(default_factory=list)
    name: str | None = None
    capabilities: list[str] | None = None
    capability_policy: CapabilityPolicy | None = None
    audit: str | None = None
    store: str | None = None
    on_conflict: OnConflict | None = None
    policy: Policy | None = None
    search: SearchMode | None = None
    tool_search: bool | None = None
    defer_above: int | None = None
    keep_active: list[str] | None = None

    def toolkit(
        self,
        *extra: SourceLike,
        name: str | None = None,
        on_conflict: OnConflict | None = None,
        capabilities: Sequence[str] | None = None,
        capability_policy: CapabilityPolicy | None = None,
        audit: Store | str | Path | None = None,
        limits: Limits | None = None,
    ) -> Toolkit:
        """A Toolkit of the manifest's sources then ``extra``; a setting given here wins over
        the manifest's, which wins over the default. Open it with ``await toolkit.start()``."""
        from toolmesh.toolkit import Toolkit

        return Toolkit(
            *self.sources,
            *extra,
            name=name or self.name or "toolmesh",
            on_conflict=on_conflict or self.on_conflict or "warn",
            capabilities=capabilities if capabilities is not None else self.capabilities,
            capability_policy=capability_policy or self.capability_policy or "locked",
            store=audit if audit is not None else (self.store or self.audit),
            limits=limits,
            hooks=[self.policy] if self.policy is not None else (),
            search=self.search or "lexical",
            tool_search=bool(self.tool_search),
            defer_above=self.defer_above,
            keep_active=self.keep_active or (),
        )


def load_manifest(path: str | Path) -> Manifest:
    """Read, check and load a manifest; ``ConfigError`` names the place of any mistake."""
    label = str(path)
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is not TOML
    except OSError as exc:
        raise ConfigError(f"cannot read the manifest: {exc.strerror}", location=label) from None
    except UnicodeDecodeError:
        raise ConfigError("the manifest is not UTF-8 text", location=label) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(exc, label) from None
    return _Loader(label, file.resolve().parent).load(data, file)


def _syntax_error(exc: tomllib.TOMLDecodeError, label: str) -> ConfigError:
    text = str(exc)
    found = _TOML_POSITION.match(text)
    if found is None:
        return ConfigError(f"not valid TOML: {text}", location=label)
    message = found["message"][:1].lower() + found["message"][1:]
    where = f"{label}: line {found['line']}, column {found['column']}"
    return ConfigError(f"not valid TOML: {message}", location=where)


class _Loader:
    def __init__(self, label: str, base_dir: Path) -> None:
        self.label = label
        self.base_dir = base_dir
        self._mcp: list[tuple[str, Source]] = []  # each MCP source, with where it is declared

    def at(self, where: str) -> str:
        return f"{self.label}: {where}"

    def load(self, data: dict[str, Any], file: Path) -> Manifest:
        unknown = set(data) - _TABLES
        if unknown:
            raise ConfigError(
                f"unknown table(s) {', '.join(sorted(unknown))}; a manifest has "
                + ", ".join(sorted(_TABLES)),
                location=self.label,
            )
        manifest = Manifest(path=file.resolve())
        skills_dir = self._toolkit(data.get("toolkit", {}), manifest)
        tools = data.get("tools", [])
        if not isinstance(tools, list):
            raise ConfigError("write each tool as a [[tools]] table", location=self.at("tools"))
        for index, entry in enumerate(tools):
            manifest.sources.extend(self._entry(index, entry))
        if "builtins" in data:
            manifest.sources.extend(self._table("builtins", "builtins", BUILTINS_MODULE, data))
        if skills_dir is not None:
            from toolmesh.sources.skills import SkillsSource

            manifest.sources.append(SkillsSource(skills_dir))
        for table in _MCP_TABLES:
            if table in data:
                manifest.sources.extend(self._table(table, "mcp", KIND_MODULES["mcp"], data))
        if "agents" in data:
            manifest.sources.extend(self._table("agents", "a2a", KIND_MODULES["a2a"], data))
        if "policy" in data:
            table = data["policy"]
            if not isinstance(table, dict):
                raise ConfigError("[policy] must be a table", location=self.at("policy"))
            manifest.policy = Policy.from_config(table, where=self.at("policy"))
        if len(self._mcp) > 1:  # one table checks its own servers; this, across all of them
            from toolmesh.mcp.config import check_manifest_prefixes

            check_manifest_prefixes(self._mcp, location=self.label)
        return manifest

    # -- [toolkit] -------------------------------------------------------------------------------

    def _toolkit(self, table: Any, manifest: Manifest) -> Path | None:
        if not isinstance(table, dict):
            raise ConfigError("must be a table", location=self.at("toolkit"))
        unknown = set(table) - _TOOLKIT_KEYS
        if unknown:
            raise ConfigError(
                f"unknown key(s) {', '.join(sorted(unknown))}; [toolkit] takes "
                + ", ".join(sorted(_TOOLKIT_KEYS)),
                location=self.at("toolkit"),
            )
        if "name" in table:
            manifest.name = self._string(table, "name", "toolkit.name")
        if "capabilities" in table:
            manifest.capabilities = self._tags(table, "toolkit.capabilities")
        if "capability_policy" in table:
            manifest.capability_policy = self._choice(
                table["capability_policy"], ("locked", "extensible"), "toolkit.capability_policy"
            )
        if "on_conflict" in table:
            manifest.on_conflict = self._choice(
                table["on_conflict"], ("warn", "error"), "toolkit.on_conflict"
            )
        if "audit" in table:
            audit = self._string(table, "audit", "toolkit.audit")
            keep = audit in (":memory:", "memory", "memory://") or "://" in audit
            manifest.audit = audit if keep else str(self.base_dir / Path(audit).expanduser())
            if not keep and not Path(manifest.audit).parent.is_dir():
                raise ConfigError(
                    f"the folder of {manifest.audit} does not exist",
                    location=self.at("toolkit.audit"),
                )
        if "store" in table:
            if "audit" in table:
                raise ConfigError(
                    "give either store or audit (a SQLite path), not both",
                    location=self.at("toolkit"),
                )
            store = self._string(table, "store", "toolkit.store")
            if "://" not in store:
                raise ConfigError(
                    "must be a URL: sqlite:///PATH or postgresql://USER@HOST:PORT/DB",
                    location=self.at("toolkit.store"),
                )
            if store.startswith("sqlite:///"):
                path = store.removeprefix("sqlite:///")
                store = "sqlite:///" + str(self.base_dir / Path(path).expanduser())
            manifest.store = store
        if "search" in table:
            manifest.search = self._choice(table["search"], ("lexical", "hybrid"), "toolkit.search")
        if "tool_search" in table:
            if not isinstance(table["tool_search"], bool):
                raise ConfigError("must be true or false", location=self.at("toolkit.tool_search"))
            manifest.tool_search = table["tool_search"]
        if "defer_above" in table:
            budget = table["defer_above"]
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                raise ConfigError(
                    "must be a positive number of tokens", location=self.at("toolkit.defer_above")
                )
            manifest.defer_above = budget
        if "keep_active" in table:
            manifest.keep_active = self._globs(table, "keep_active", "toolkit")
        if "skills_dir" in table:
            folder = self.base_dir / self._string(table, "skills_dir", "toolkit.skills_dir")
            if not folder.is_dir():
                raise ConfigError(
                    f"{folder} is not a folder", location=self.at("toolkit.skills_dir")
                )
            return folder
        return None

    # -- [[tools]] -------------------------------------------------------------------------------

    def _entry(self, index: int, entry: Any) -> list[Source]:
        where = f"tools[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError("must be a table", location=self.at(where))
        kind = entry.get("kind")
        if not isinstance(kind, str) or not kind:
            raise ConfigError(f"needs kind = one of {', '.join(KINDS)}", location=self.at(where))
        where = f'{where} (kind "{kind}")'
        if kind not in KINDS:
            raise ConfigError(
                f"unknown kind; kinds are {', '.join(KINDS)}", location=self.at(where)
            )
        enabled = entry.get("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError("enabled must be true or false", location=self.at(where))
        if not enabled:
            return []
        options = self._options(entry, where)
        spec = self._flatten(entry, where)
        if kind in _OWN_PREFIX and options["prefix"]:
            spec["prefix"] = options.pop("prefix")
            options["prefix"] = None
        if kind == "python":
            sources = self._python(spec, where)
        else:
            sources = self._call(KIND_MODULES[kind], kind, spec, where)
        if kind == "mcp":
            self._mcp += [(f"tools[{index}]", source) for source in sources]
        return [self._wrap(source, options) for source in sources]

    def _options(self, entry: Mapping[str, Any], where: str) -> dict[str, Any]:
        options: dict[str, Any] = {
            "capabilities": self._tags(entry, f"{where}: capabilities")
            if "capabilities" in entry
            else [],
            "allow": self._globs(entry, "allow", where),
            "deny": self._globs(entry, "deny", where),
            "prefix": None,
            "placement": self._placement(entry, where),
            "where": self.at(where),
        }
        if "prefix" in entry:
            prefix = entry["prefix"]
            if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", prefix):
                raise ConfigError("prefix must be letters, digits, _ or -", location=self.at(where))
            options["prefix"] = prefix
        return options

    def _flatten(self, entry: Mapping[str, Any], where: str) -> dict[str, Any]:
        config = entry.get("config", {})
        if not isinstance(config, dict):
            raise ConfigError("config must be a table", location=self.at(where))
        spec = {k: v for k, v in entry.items() if k not in _SHARED_KEYS}
        both = set(spec) & set(config)
        if both:
            raise ConfigError(
                f"{', '.join(sorted(both))} given both beside kind and in config",
                location=self.at(where),
            )
        return {"kind": entry["kind"], **spec, **config}

    def _placement(self, entry: Mapping[str, Any], where: str) -> dict[str, Any] | None:
        placement = entry.get("placement", "local")
        if placement not in ("local", "ray"):
            raise ConfigError(
                f'placement must be "local" or "ray", not {placement!r}', location=self.at(where)
            )
        options = entry.get("ray", {})
        if not isinstance(options, dict):
            raise ConfigError("ray must be a table of Ray options", location=self.at(where))
        if options and placement != "ray":
            raise ConfigError('ray options need placement = "ray"', location=self.at(where))
        return dict(options) if placement == "ray" else None

    def _wrap(self, source: Source, options: Mapping[str, Any]) -> Source:
        if options["placement"] is not None:
            module = importlib.import_module(PLACEMENT_MODULE)
            source = module.placed_on_ray(source, options["placement"], where=options["where"])
        if options["allow"] or options["deny"]:
            source = _filtered_by_own_names(source, options["allow"], options["deny"])
        if options["prefix"]:
            source = Prefixed(source, options["prefix"])
        if options["capabilities"]:
            source = Tagged(source, capabilities=options["capabilities"])
        return source

    def _python(self, spec: Mapping[str, Any], where: str) -> list[Source]:
        if ("module" in spec) == ("path" in spec):
            raise ConfigError(
                'kind python needs either module = "pkg.mod:attr" (in-process) or '
                'path = "./folder" (an isolated package)',
                location=self.at(where),
            )
        if "path" in spec:
            return self._call(PYTHON_PACKAGE_MODULE, "python", spec, where)
        try:
            return python_sources(spec, base_dir=self.base_dir)
        except ConfigError as exc:
            raise _located(exc, self.at(where)) from None

    def _table(self, table: str, kind: str, module: str, data: Mapping[str, Any]) -> list[Source]:
        value = data[table]
        if not isinstance(value, dict):
            raise ConfigError("must be a table", location=self.at(table))
        if kind == "mcp":
            entry: dict[str, Any] = {"kind": "mcp", "servers": value}
        elif kind == "a2a":
            entry = {"kind": "a2a", "agents": value}
        else:
            entry = value
        sources = self._call(module, kind, entry, table)
        if kind == "mcp":
            self._mcp += [(table, source) for source in sources]
        return sources

    def _call(self, module: str, kind: str, entry: Mapping[str, Any], where: str) -> list[Source]:
        location = self.at(where)
        function = _sources_function(module, kind, location)
        try:
            sources = function(entry, base_dir=self.base_dir)
        except ConfigError as exc:
            raise _located(exc, location) from None
        except Exception as exc:  # a kind's bug or bad input it did not anticipate
            raise ConfigError(f"{type(exc).__name__}: {exc}", location=location) from exc
        if not isinstance(sources, list) or not all(isinstance(s, Source) for s in sources):
            raise ConfigError(
                f"{module}.sources_from_manifest must return a list of sources",
                location=location,
            )
        return sources

    # -- values ----------------------------------------------------------------------------------

    def _string(self, table: Mapping[str, Any], key: str, where: str) -> str:
        value = table[key]
        if not isinstance(value, str) or not value:
            raise ConfigError("must be a non-empty string", location=self.at(where))
        return value

    def _choice(self, value: Any, choices: Sequence[str], where: str) -> Any:
        if value not in choices:
            raise ConfigError(
                f"must be {' or '.join(repr(c) for c in choices)}, not {value!r}",
                location=self.at(where),
            )
        return value

    def _tags(self, table: Mapping[str, Any], where: str) -> list[str]:
        value = table["capabilities"]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError("capabilities must be a list of strings", location=self.at(where))
        try:
            return [check_tag(tag) for tag in value]
        except (ValueError, ConfigError) as exc:
            raise ConfigError(str(exc), location=self.at(where)) from None

    def _globs(self, entry: Mapping[str, Any], key: str, where: str) -> list[str]:
        value = entry.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key} must be a list of name patterns", location=self.at(where))
        return value


def _filtered_by_own_names(source: Source, allow: Sequence[str], deny: Sequence[str]) -> Source:
    """``Filtered`` inside the prefix a kind gave its tools itself (an MCP server's name), so
    ``allow``/``deny`` match the tools' own names, as with every other kind."""
    if isinstance(source, Prefixed):
        inner = _filtered_by_own_names(source.wrapped, allow, deny)
        return Prefixed(inner, source.prefix, separator=source.separator)
    return Filtered(source, allow=allow, deny=deny)


def _located(exc: ConfigError, location: str) -> ConfigError:
    """``exc`` with the manifest location in front of whatever location it had."""
    inner = f"{exc.location}: " if exc.location else ""
    message = str(exc)[len(inner) :] if inner else str(exc)
    located = ConfigError(message, location=f"{location}: {exc.location}" if inner else location)
    located.__cause__ = exc.__cause__
    return located


def _sources_function(module: str, kind: str, location: str) -> SourcesFunction:
    """The kind's ``sources_from_manifest``, imported now (only kinds in use are imported)."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module == missing or module.startswith(missing + "."):
            raise ConfigError(
                f'kind "{kind}" is not available in this build ({module} is missing)',
                location=location,
            ) from None
        raise ConfigError(
            f'kind "{kind}" needs the package {missing!r}, which is not installed',
            location=location,
        ) from None
    function = getattr(loaded, "sources_from_manifest", None)
    if not callable(function):
        raise ConfigError(
            f'kind "{kind}" is not available in this build ({module} has no sources_from_manifest)',
            location=location,
        )
    return function  # type: ignore[no-any-return]


def python_sources(entry: Mapping[str, Any], *, base_dir: Path) -> list[Source]:
    """Kind python with ``module = "pkg.mod:attr"``: the object in-process, as a source.

    The manifest's folder is importable. The attribute may be anything ``Toolkit.add`` takes:
    a ToolPlugin (class or instance), a Toolkit, a Source, a Tool, an @tool function or a list.
    """
    from toolmesh.toolkit import as_source

    unknown = set(entry) - {"kind", "module", "name"}
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(sorted(unknown))}; kind python with module takes "
            "module and name"
        )
    spec = entry["module"]
    if not isinstance(spec, str) or not _MODULE_ATTR.match(spec):
        raise ConfigError(f'module must be "pkg.mod:attr", not {spec!r}')
    module_name, _, attr_path = spec.partition(":")
    folder = str(base_dir)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    except (Exception, SystemExit) as exc:  # the module's own code failed (or called exit)
        raise ConfigError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"{module_name!r} has no attribute {attr_path!r}") from None
    try:
        source = as_source(target)
    except ConfigError:
        raise
    except Exception as exc:  # user code ran here: a plugin's constructor or its _list_tools
        raise ConfigError(f"cannot use {spec!r} as tools: {type(exc).__name__}: {exc}") from exc
    name = entry.get("name")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigError(f"name must be a non-empty string, not {name!r}")
    if name:
        source.name = name
    elif source.name in ("tools", "source"):
        source.name = f"python:{spec}"
    return [source]
