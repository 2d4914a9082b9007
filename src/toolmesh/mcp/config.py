"""MCP server declarations: the common ``mcpServers`` JSON shape and toolmesh.toml entries.

One ``MCPServerConfig`` per server. The JSON shape used by Claude Desktop and Cursor
(``{"mcpServers": {NAME: {...}}}``) is accepted, as are VS Code's ``{"servers": {...}}`` and
``{"mcp": {"servers": {...}}}`` and a bare ``{NAME: {...}}`` mapping. A server runs over stdio
when it has a ``command`` and over streamable HTTP when it has a ``url``.

``${VAR}`` (or ``${env:VAR}``) in ``env`` values, ``headers`` and ``bearer_token`` is expanded
from the environment when the config is read. Those values are secrets: they never appear in a
``repr``, a status reason or a log line.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from toolmesh.errors import ConfigError

if TYPE_CHECKING:
    from toolmesh.sources.base import Source

__all__ = [
    "MCPServerConfig",
    "check_manifest_prefixes",
    "expand_env",
    "load_mcp_config",
    "mcp_configs",
    "parse_mcp_config",
    "parse_mcp_server",
    "sources_from_manifest",
]

Transport = Literal["stdio", "http"]
ConnectMode = Literal["auto", "legacy", "2026-07-28"]

DEFAULT_CONNECT_TIMEOUT = 30.0
_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_ENV_REF = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}")
_WRAPPERS = ("mcpServers", "servers", "mcp")
_HTTP_TYPES = {"http", "streamable-http", "streamable_http", "streamableHttp"}

_KNOWN_KEYS = frozenset(
    {
        "type",
        "transport",
        "command",
        "args",
        "env",
        "cwd",
        "url",
        "headers",
        "bearer_token",
        "prefix",
        "allow",
        "deny",
        "capabilities",
        "tags",
        "connect_timeout",
        "reset_timeout_on_progress",
        "max_total_timeout",
        "enabled",
        "disabled",
        "defer_loading",
        "mode",
        "name",
        "kind",
        "config",
        "description",
    }
)


@dataclass(frozen=True, slots=True)
class MCPServerConfig:
    """How to reach one MCP server and how its tools join a toolkit.

    ``prefix``: tools are named ``{prefix}_{tool}``; None means the server's name, "" none.
    ``allow``/``deny``: glob patterns over the server's own tool names.
    ``capabilities``/``tags``: added to every tool of the server.
    ``connect_timeout``: for connecting and the handshake; over HTTP also for an answer owed only
    a status (a notification's 202, the session's DELETE), but no more than 10 s for that.
    ``reset_timeout_on_progress``: each progress notification restarts the call's timeout,
    never beyond ``max_total_timeout`` seconds from the start of the call.
    ``defer_loading``: true defers every tool (found through search instead of listed); a number
    defers them once the server has more tools than that.
    """

    def defers(self, tool_count: int) -> bool:
        """Whether this server's tools are deferred when it has ``tool_count`` of them."""
        setting = self.defer_loading
        if isinstance(setting, bool):
            return setting
        return tool_count > setting

    name: str
    transport: Transport
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    cwd: str | None = None
    url: str = field(default="", repr=False)  # shown by __repr__ without its user-info
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    prefix: str | None = None
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    reset_timeout_on_progress: bool = False
    max_total_timeout: float | None = None
    enabled: bool = True
    defer_loading: bool | int = False
    mode: ConnectMode = "auto"

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        shown["url"] = _without_userinfo(self.url)  # user:password@ is a secret too
        settings = ", ".join(f"{name}={value!r}" for name, value in shown.items())
        return f"MCPServerConfig({settings})"

    @property
    def tool_prefix(self) -> str:
        """The prefix every tool name gets ("" for none)."""
        chosen = self.name if self.prefix is None else self.prefix
        return _NAME.sub("_", chosen).strip("_")

    def describe(self) -> str:
        """Where the server is, without secrets: the command line or the URL."""
        if self.transport == "stdio":
            return " ".join([self.command, *self.args])
        return _without_userinfo(self.url)

    def mask(self, text: str) -> str:
        """``text`` with every configured secret (an ``env`` or header value, the bearer token)
        replaced by ``***``: a server's own output may quote them (a rejected token, say). Values
        under four characters are left alone, or every "1" of a flag would go."""
        secrets = {v for v in (*self.env.values(), *self.headers.values()) if len(v) >= 4}
        if self.bearer_token and len(self.bearer_token) >= 4:
            secrets.add(self.bearer_token)
        for secret in sorted(secrets, key=len, reverse=True):
            if secret in text:
                text = text.replace(secret, "***")
        return text

    def http_headers(self) -> dict[str, str]:
        """The headers sent with every HTTP request (bearer token included)."""
        headers = dict(self.headers)
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        return headers


def expand_env(text: str, *, where: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with ``${VAR}``/``${env:VAR}`` replaced from the environment.

    An unset variable is a ConfigError naming the variable (never its would-be value)."""
    source = os.environ if environ is None else environ

    def replace(match: re.Match[str]) -> str:
        variable = match.group(1)
        value = source.get(variable)
        if value is None:
            raise ConfigError(f"{where}: environment variable {variable!r} is not set")
        return value

    return _ENV_REF.sub(replace, text)


def parse_mcp_config(
    obj: Any, *, base_dir: Path | None = None, location: str = "mcp"
) -> list[MCPServerConfig]:
    """Every server of an MCP configuration, in declaration order.

    ``obj`` is a parsed JSON/TOML document in any of the accepted shapes, a list of server
    tables (each with a ``name``) or of ``MCPServerConfig``; ``base_dir`` resolves relative
    ``cwd`` folders."""
    if isinstance(obj, MCPServerConfig):
        return [obj]
    if isinstance(obj, list | tuple):
        listed = [_one_of_list(item, i, base_dir, location) for i, item in enumerate(obj)]
        _check_prefixes([("", config) for config in listed], location)
        return listed
    if not isinstance(obj, Mapping):
        raise ConfigError(
            f"{location}: expected an object of MCP servers, not {type(obj).__name__}"
        )
    servers = _unwrap(obj, location)
    configs = []
    for name, table in servers.items():
        configs.append(parse_mcp_server(str(name), table, base_dir=base_dir, location=location))
    _check_prefixes([("", config) for config in configs], location)
    return configs


def mcp_configs(obj: Any) -> list[MCPServerConfig]:
    """Servers from what ``create_toolkit(mcp=...)`` accepts: a JSON/TOML file path, a parsed
    document in any accepted shape, a list of server tables or ``MCPServerConfig`` objects."""
    if isinstance(obj, str | Path):
        return load_mcp_config(obj)
    return parse_mcp_config(obj)


def load_mcp_config(path: str | Path) -> list[MCPServerConfig]:
    """The servers declared in a JSON (``mcpServers`` shape) or TOML file."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc.strerror or exc}") from exc
    try:
        if file.suffix == ".toml":
            import tomllib

            document: Any = tomllib.loads(text)
        else:
            document = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{file}: not valid {file.suffix.lstrip('.') or 'JSON'}: {exc}") from exc
    if file.suffix == ".toml":
        return _manifest_servers(document, base_dir=file.parent, location=str(file))
    return parse_mcp_config(document, base_dir=file.parent, location=str(file))


def _manifest_servers(
    document: Mapping[str, Any], *, base_dir: Path, location: str
) -> list[MCPServerConfig]:
    """The MCP servers of a toolmesh.toml: its server tables and ``kind = "mcp"`` tools."""
    servers: list[tuple[str, MCPServerConfig]] = []  # each with where it is declared
    for key in _WRAPPERS:
        if key in document:
            configs = parse_mcp_config({key: document[key]}, base_dir=base_dir, location=location)
            servers += [(key, config) for config in configs]
    for index, entry in enumerate(document.get("tools") or ()):
        if isinstance(entry, Mapping) and entry.get("kind") == "mcp":
            where = f"{location}: tools[{index}]"
            name = entry.get("name")
            if not isinstance(name, str):
                raise ConfigError(f'{where} (kind "mcp"): needs a name')
            table = {k: v for k, v in entry.items() if k not in ("kind", "name")}
            config = parse_mcp_server(name, table, base_dir=base_dir, location=where)
            servers.append((f"tools[{index}]", config))
    _check_prefixes(servers, location)
    return [config for _, config in servers]


def check_manifest_prefixes(declared: Sequence[tuple[str, Source]], *, location: str) -> None:
    """The manifest loader's check across its ``[mcpServers]``, ``[servers]`` and ``[mcp]``
    tables and ``kind = "mcp"`` entries (each table checks its own servers): no two MCP servers
    of one manifest may give their tools one prefix. ``declared``: each source with where it is
    declared (``mcpServers``, ``tools[2]``)."""
    servers = [
        (where, config) for where, source in declared if (config := _config_of(source)) is not None
    ]
    _check_prefixes(servers, location)


def _config_of(source: Source) -> MCPServerConfig | None:
    """The settings of the MCP server inside ``source`` (filtered, tagged, prefixed), if any."""
    from toolmesh.sources.wrappers import WrapperSource

    while isinstance(source, WrapperSource):
        source = source.wrapped
    config = getattr(source, "config", None)
    return config if isinstance(config, MCPServerConfig) else None


def parse_mcp_server(
    name: str,
    table: Any,
    *,
    base_dir: Path | None = None,
    location: str = "mcp",
) -> MCPServerConfig:
    """One server's settings (a table of the ``mcpServers`` shape) as an ``MCPServerConfig``."""
    where = f"{location}: server {name!r}"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table of settings, not {type(table).__name__}")
    if not name or not _NAME.sub("", name):
        raise ConfigError(f"{where}: a server needs a name with letters or digits")
    settings = dict(table)
    nested = settings.pop("config", None)
    if isinstance(nested, Mapping):
        settings = {**nested, **settings}
    unknown = sorted(set(settings) - _KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(map(repr, unknown))}")
    transport = _transport(settings, where)
    enabled = _bool(settings, "enabled", where, True) and not _bool(
        settings, "disabled", where, False
    )
    values: dict[str, Any] = {
        "name": name,
        "transport": transport,
        "prefix": _prefix(settings.get("prefix"), where),
        "allow": _strings(settings, "allow", where),
        "deny": _strings(settings, "deny", where),
        "capabilities": _strings(settings, "capabilities", where),
        "tags": _strings(settings, "tags", where),
        "connect_timeout": _seconds(settings, "connect_timeout", where, DEFAULT_CONNECT_TIMEOUT),
        "reset_timeout_on_progress": _bool(settings, "reset_timeout_on_progress", where, False),
        "max_total_timeout": _optional_seconds(settings, "max_total_timeout", where),
        "enabled": enabled,
        "defer_loading": _defer(settings.get("defer_loading", False), where),
        "mode": _mode(settings.get("mode", "auto"), where),
    }
    if transport == "stdio":
        values.update(_stdio_settings(settings, where, base_dir, expand=enabled))
    else:
        values.update(_http_settings(settings, where, expand=enabled))
    _check_capabilities(values["capabilities"], where)
    return MCPServerConfig(**values)


def sources_from_manifest(entry: Mapping[str, Any], *, base_dir: Path) -> list[Source]:
    """The manifest contract: MCP sources of one toolmesh.toml entry.

    For the ``[mcpServers]``/``[servers]``/``[mcp]`` tables (``entry = {"kind": "mcp",
    "servers": {...}}``) each server's own prefix, allow/deny and capabilities apply here. For a
    ``[[tools]]`` entry of kind "mcp" (named by its ``name``) the loader applies allow/deny and
    capabilities itself; the tools are named ``{name}_{tool}``, or ``{prefix}_{tool}`` when the
    entry's ``prefix`` reaches this function."""
    from toolmesh.mcp.source import mcp_source

    if "servers" in entry:
        configs = parse_mcp_config(entry["servers"], base_dir=base_dir, location="toolmesh.toml")
        return [mcp_source(config) for config in configs]
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError('an "mcp" tool entry needs a name (the server\'s name)')
    generic = {"kind", "enabled", "capabilities", "allow", "deny", "name"}
    table = {k: v for k, v in entry.items() if k not in generic}
    config = parse_mcp_server(name, table, base_dir=base_dir, location="toolmesh.toml")
    return [mcp_source(config, wrap=False)]


# -- parsing helpers ---------------------------------------------------------------------------


def _unwrap(obj: Mapping[str, Any], location: str) -> Mapping[str, Any]:
    for key in _WRAPPERS:
        if key in obj:
            inner = obj[key]
            if key == "mcp" and isinstance(inner, Mapping) and "servers" in inner:
                inner = inner["servers"]
            if not isinstance(inner, Mapping):
                raise ConfigError(
                    f"{location}: {key!r} must be an object of servers, not {type(inner).__name__}"
                )
            return inner
    return obj


def _one_of_list(item: Any, index: int, base_dir: Path | None, location: str) -> MCPServerConfig:
    if isinstance(item, MCPServerConfig):
        return item
    if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
        raise ConfigError(f"{location}[{index}]: expected a server table with a 'name'")
    table = {k: v for k, v in item.items() if k != "name"}
    return parse_mcp_server(item["name"], table, base_dir=base_dir, location=location)


def _transport(settings: Mapping[str, Any], where: str) -> Transport:
    declared = settings.get("type", settings.get("transport"))
    if declared is not None and not isinstance(declared, str):
        raise ConfigError(f"{where}: 'type' must be a string")
    if declared == "sse":
        raise ConfigError(
            f"{where}: the legacy HTTP+SSE transport is not supported; use streamable HTTP "
            '(type "http")'
        )
    has_command, has_url = "command" in settings, "url" in settings
    if declared == "stdio" or (declared is None and has_command and not has_url):
        if not has_command:
            raise ConfigError(f"{where}: a stdio server needs a 'command'")
        return "stdio"
    if declared in _HTTP_TYPES or (declared is None and has_url and not has_command):
        if not has_url:
            raise ConfigError(f"{where}: an HTTP server needs a 'url'")
        return "http"
    if declared is not None:
        raise ConfigError(f"{where}: unknown type {declared!r} (use 'stdio' or 'http')")
    if has_command and has_url:
        raise ConfigError(f"{where}: give either 'command' (stdio) or 'url' (HTTP), not both")
    raise ConfigError(f"{where}: give a 'command' (stdio) or a 'url' (streamable HTTP)")


def _stdio_settings(
    settings: Mapping[str, Any], where: str, base_dir: Path | None, *, expand: bool
) -> dict[str, Any]:
    command = settings["command"]
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(f"{where}: 'command' must be a non-empty string")
    env = settings.get("env") or {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str | int | float | bool) for k, v in env.items()
    ):
        raise ConfigError(f"{where}: 'env' must be an object of strings")
    cwd = settings.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str):
            raise ConfigError(f"{where}: 'cwd' must be a string")
        folder = Path(os.path.expanduser(cwd))
        if not folder.is_absolute() and base_dir is not None:
            folder = base_dir / folder
        cwd = str(folder)
    if "url" in settings or "headers" in settings or "bearer_token" in settings:
        raise ConfigError(f"{where}: 'url', 'headers' and 'bearer_token' are for HTTP servers")
    return {
        "command": command,
        "args": _strings(settings, "args", where),
        "env": {
            k: expand_env(str(v), where=f"{where} env {k!r}") if expand else str(v)
            for k, v in env.items()
        },
        "cwd": cwd,
    }


def _http_settings(settings: Mapping[str, Any], where: str, *, expand: bool) -> dict[str, Any]:
    url = settings["url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: 'url' must be an http:// or https:// URL")
    headers = settings.get("headers") or {}
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ConfigError(f"{where}: 'headers' must be an object of strings")
    token = settings.get("bearer_token")
    if token is not None and not isinstance(token, str):
        raise ConfigError(f"{where}: 'bearer_token' must be a string")
    if "command" in settings or "args" in settings or "env" in settings:
        raise ConfigError(f"{where}: 'command', 'args' and 'env' are for stdio servers")

    def expanded(text: str, what: str) -> str:
        return expand_env(text, where=f"{where} {what}") if expand else text

    return {
        "url": url,
        "headers": {k: expanded(v, f"header {k!r}") for k, v in headers.items()},
        "bearer_token": expanded(token, "bearer_token") if token else None,
    }


def _strings(settings: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = settings.get(key, ())
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key!r} must be a list of strings")
    return tuple(value)


def _bool(settings: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = settings.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key!r} must be true or false")
    return value


def _seconds(settings: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = settings.get(key, default)
    # `not value > 0` also refuses NaN (TOML has `nan`, Python's JSON reader `NaN`)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{where}: {key!r} must be a positive number of seconds")
    return float(value)


def _optional_seconds(settings: Mapping[str, Any], key: str, where: str) -> float | None:
    if settings.get(key) is None:
        return None
    return _seconds(settings, key, where, 0.0)


def _defer(value: Any, where: str) -> bool | int:
    if isinstance(value, bool) or (isinstance(value, int) and value >= 0):
        return value
    raise ConfigError(f"{where}: 'defer_loading' must be true, false or a number of tools")


def _prefix(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if value is False:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: 'prefix' must be a string (or false for none)")
    return value


def _mode(value: Any, where: str) -> ConnectMode:
    if value not in ("auto", "legacy", "2026-07-28"):
        raise ConfigError(f"{where}: 'mode' must be 'auto', 'legacy' or '2026-07-28'")
    mode: ConnectMode = value
    return mode


def _check_prefixes(servers: Sequence[tuple[str, MCPServerConfig]], location: str) -> None:
    """Two servers must not give their tools one prefix: names would collide. Each server comes
    with where it is declared, so the error can name both places; two servers of one name in
    two places collide too."""
    first: dict[str, tuple[str, MCPServerConfig]] = {}
    for where, config in servers:
        prefix = config.tool_prefix
        if not prefix:
            continue
        if prefix not in first:
            first[prefix] = (where, config)
            continue
        other_where, other = first[prefix]
        both = (
            f"servers {other.name!r} and {config.name!r}"
            if where == other_where
            else f"server {other.name!r} of {other_where} and server {config.name!r} of {where}"
        )
        raise ConfigError(
            f"{location}: {both} would both name their tools {prefix}_*; give one of them "
            "another 'prefix'"
        )


def _check_capabilities(tags: Sequence[str], where: str) -> None:
    from toolmesh.capabilities import check_tag

    for tag in tags:
        try:
            check_tag(tag)
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"
