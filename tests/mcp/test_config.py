"""MCP server declarations: the mcpServers JSON shape (and its wrappers), toolmesh.toml entries,
environment expansion, secrets kept out of reprs, and clear errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from toolmesh import ConfigError, create_toolkit
from toolmesh.manifest import load_manifest
from toolmesh.mcp.config import (
    expand_env,
    load_mcp_config,
    mcp_configs,
    parse_mcp_config,
    sources_from_manifest,
)
from toolmesh.mcp.source import MCPSource
from toolmesh.sources.wrappers import Filtered, Prefixed, Tagged, WrapperSource

SERVERS = {
    "github": {
        "command": "npx",
        "args": ["-y", "server-github"],
        "env": {"GITHUB_TOKEN": "${TEST_GH_TOKEN}"},
    },
    "remote": {
        "url": "https://mcp.example.com/mcp",
        "headers": {"X-Api-Key": "${env:TEST_API_KEY}"},
        "bearer_token": "${TEST_BEARER}",
    },
}


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_GH_TOKEN", "gh-secret")
    monkeypatch.setenv("TEST_API_KEY", "key-secret")
    monkeypatch.setenv("TEST_BEARER", "bearer-secret")


@pytest.mark.parametrize(
    "document",
    [
        {"mcpServers": SERVERS},
        {"servers": SERVERS},
        {"mcp": {"servers": SERVERS}},
        {"mcp": SERVERS},
        SERVERS,
    ],
)
def test_every_common_shape_is_accepted(document: dict[str, object]) -> None:
    github, remote = parse_mcp_config(document)
    assert (github.name, github.transport, github.command) == ("github", "stdio", "npx")
    assert github.args == ("-y", "server-github")
    assert github.env == {"GITHUB_TOKEN": "gh-secret"}
    assert (remote.transport, remote.url) == ("http", "https://mcp.example.com/mcp")
    assert remote.http_headers() == {
        "X-Api-Key": "key-secret",
        "Authorization": "Bearer bearer-secret",
    }


def test_secrets_never_show_in_reprs_or_descriptions() -> None:
    configs = parse_mcp_config({"mcpServers": SERVERS})
    text = " ".join(repr(c) + c.describe() for c in configs)
    for secret in ("gh-secret", "key-secret", "bearer-secret"):
        assert secret not in text
    remote = parse_mcp_config({"r": {"url": "https://user:pw@host.example/mcp"}})[0]
    assert remote.describe() == "https://host.example/mcp"


def test_an_unset_variable_is_named_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_GH_TOKEN")
    with pytest.raises(ConfigError, match="'TEST_GH_TOKEN' is not set") as caught:
        parse_mcp_config({"mcpServers": SERVERS})
    assert "server 'github'" in str(caught.value)
    assert expand_env("a${X}b", where="w", environ={"X": "-"}) == "a-b"


def test_a_disabled_server_needs_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_GH_TOKEN")
    (config,) = parse_mcp_config({"github": {**SERVERS["github"], "disabled": True}})
    assert not config.enabled
    assert MCPSource(config).status.state == "disabled"


def test_per_server_settings() -> None:
    (config,) = parse_mcp_config(
        {
            "mcpServers": {
                "my.server": {
                    "command": "srv",
                    "cwd": "tools",
                    "allow": ["read_*"],
                    "deny": ["read_secret"],
                    "capabilities": ["fs::read"],
                    "tags": ["files"],
                    "connect_timeout": 5,
                    "reset_timeout_on_progress": True,
                    "max_total_timeout": 600,
                    "defer_loading": True,
                    "mode": "legacy",
                }
            }
        },
        base_dir=Path("/srv/app"),
    )
    assert config.tool_prefix == "my_server"  # the default prefix is the sanitized name
    assert config.cwd == "/srv/app/tools"
    assert (config.allow, config.deny) == (("read_*",), ("read_secret",))
    assert config.capabilities == ("fs::read",) and config.tags == ("files",)
    assert config.connect_timeout == 5.0 and config.max_total_timeout == 600.0
    assert config.reset_timeout_on_progress and config.defer_loading
    assert config.mode == "legacy"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({}, "give a 'command'"),
        ({"command": "x", "url": "http://h/mcp"}, "not both"),
        ({"type": "sse", "url": "http://h/sse"}, "legacy HTTP+SSE transport"),
        ({"url": "ftp://h"}, "http:// or https://"),
        ({"command": "x", "headers": {"a": "b"}}, "are for HTTP servers"),
        ({"command": "x", "colour": "red"}, "unknown setting(s) 'colour'"),
        ({"command": "x", "allow": "a", "connect_timeout": -1}, "'connect_timeout' must be"),
        ({"command": "x", "capabilities": ["bad tag!"]}, "is not a capability tag"),
        ({"command": "x", "mode": "2099"}, "'mode' must be"),
        ("npx server", "expected a table"),
    ],
)
def test_bad_settings_are_named(table: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_mcp_config({"mcpServers": {"srv": table}}, location="mcp.json")
    assert message in str(caught.value)
    assert str(caught.value).startswith("mcp.json: server 'srv'")


def test_two_servers_cannot_share_a_prefix() -> None:
    with pytest.raises(ConfigError, match="would both name their tools a_b_"):
        parse_mcp_config({"a.b": {"command": "x"}, "a_b": {"command": "y"}})
    ok = parse_mcp_config({"a.b": {"command": "x"}, "a_b": {"command": "y", "prefix": "ab"}})
    assert [c.tool_prefix for c in ok] == ["a_b", "ab"]


def test_servers_of_a_list_or_of_different_toml_tables_cannot_share_a_prefix(
    tmp_path: Path,
) -> None:
    with pytest.raises(
        ConfigError, match="mcp: servers 'x' and 'x' would both name their tools x_"
    ):
        parse_mcp_config([{"name": "x", "command": "a"}, {"name": "x", "command": "b"}])
    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(
        "[[tools]]\nkind = 'mcp'\nname = 'x'\ncommand = 'a'\n[servers.x]\ncommand = 'b'\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_mcp_config(manifest)
    assert str(caught.value) == (
        f"{manifest}: server 'x' of servers and server 'x' of tools[0] would both name their "
        "tools x_*; give one of them another 'prefix'"
    )


def test_json_and_toml_files(tmp_path: Path) -> None:
    json_file = tmp_path / "mcp.json"
    json_file.write_text(json.dumps({"mcpServers": {"one": {"command": "srv"}}}))
    toml_file = tmp_path / "toolmesh.toml"
    toml_file.write_text(
        '[mcpServers.two]\ncommand = "srv"\n\n'
        '[[tools]]\nkind = "mcp"\nname = "three"\nurl = "http://127.0.0.1:9/mcp"\n'
    )
    assert [c.name for c in load_mcp_config(json_file)] == ["one"]
    assert [c.name for c in mcp_configs(str(toml_file))] == ["two", "three"]
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match=r"bad\.json: not valid json"):
        load_mcp_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_mcp_config(tmp_path / "missing.json")


def layers(source: object) -> list[type]:
    out = []
    while isinstance(source, WrapperSource):
        out.append(type(source))
        source = source.wrapped
    return [*out, type(source)]


def test_manifest_tables_apply_each_servers_settings(tmp_path: Path) -> None:
    entry = {
        "kind": "mcp",
        "servers": {"fs": {"command": "srv", "deny": ["rm"], "capabilities": ["fs"]}},
    }
    (source,) = sources_from_manifest(entry, base_dir=tmp_path)
    assert layers(source) == [Prefixed, Tagged, Filtered, MCPSource]


def test_manifest_tool_entries_leave_generic_keys_to_the_loader(tmp_path: Path) -> None:
    entry = {"kind": "mcp", "name": "gh", "command": "srv", "capabilities": ["net"]}
    (source,) = sources_from_manifest(entry, base_dir=tmp_path)
    assert layers(source) == [Prefixed, MCPSource]  # the default gh_tool naming only
    assert isinstance(source, Prefixed) and source.prefix == "gh"
    named = {"kind": "mcp", "name": "gh", "command": "srv", "prefix": "git"}
    (renamed,) = sources_from_manifest(named, base_dir=tmp_path)
    assert isinstance(renamed, Prefixed) and renamed.prefix == "git"
    with pytest.raises(ConfigError, match="needs a name"):
        sources_from_manifest({"kind": "mcp", "command": "srv"}, base_dir=tmp_path)


def test_the_manifest_loader_reads_mcp_server_tables(tmp_path: Path) -> None:
    from toolmesh.manifest import load_manifest

    path = tmp_path / "toolmesh.toml"
    path.write_text('[mcpServers.fs]\ncommand = "srv"\ndeny = ["rm"]\n')
    manifest = load_manifest(path)
    (source,) = manifest.sources
    assert layers(source) == [Prefixed, Filtered, MCPSource]


async def test_create_toolkit_takes_mcp_servers() -> None:
    toolkit = await create_toolkit(
        mcp={"mcpServers": {"off": {"command": "srv", "enabled": False}}}
    )
    try:
        (source,) = toolkit.sources
        assert source.status.state == "disabled"
        assert len(toolkit) == 0
    finally:
        await toolkit.close()
    with pytest.raises(ConfigError, match="expected an object of MCP servers"):
        await create_toolkit(mcp=42)


def test_a_manifest_prefix_replaces_the_servers_own(tmp_path: Path) -> None:
    from toolmesh.manifest import load_manifest

    manifest = tmp_path / "toolmesh.toml"
    manifest.write_text(
        '[[tools]]\nkind = "mcp"\nname = "github"\nprefix = "git"\nurl = "http://127.0.0.1:9/mcp"\n'
    )
    (source,) = load_manifest(manifest).sources
    prefixes = []
    while isinstance(source, WrapperSource):
        if isinstance(source, Prefixed):
            prefixes.append(source.prefix)
        source = source.wrapped
    assert prefixes == ["git"]  # the server's tools are git_<tool>, not git_github_<tool>


async def test_a_manifest_entrys_allow_matches_the_servers_own_tool_names(
    tmp_path: Path,
) -> None:
    # mcp-server-time has get_current_time and convert_time; its tools are clock_<tool>
    manifest = tmp_path / "toolmesh.toml"
    args = json.dumps(["-m", "mcp_server_time", "--local-timezone", "UTC"])
    manifest.write_text(
        f'[[tools]]\nkind = "mcp"\nname = "clock"\ncommand = {json.dumps(sys.executable)}\n'
        f'args = {args}\nallow = ["get_*"]\n'
    )
    async with await create_toolkit(config=manifest) as kit:
        assert kit.names() == ["clock_get_current_time"]  # as `allow` does in mcpServers
    (source,) = load_manifest(manifest).sources
    assert layers(source) == [Prefixed, Filtered, MCPSource]


def test_a_urls_user_info_never_shows_in_a_repr() -> None:
    remote = parse_mcp_config({"r": {"url": "https://user:pw@host.example/mcp"}})[0]
    assert "pw" not in repr(remote)
    assert "url='https://host.example/mcp'" in repr(remote)


@pytest.mark.parametrize("key", ["connect_timeout", "max_total_timeout"])
def test_a_nan_timeout_is_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}' must be a positive number"):
        parse_mcp_config({"s": {"command": "x", key: float("nan")}})
