"""The public API's rule for a parameter that takes several strings: a lone str is one item
(``tags="network"`` is ``["network"]``, not its letters); anything but strings is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolmesh import ConfigError, Filtered, Host, Tagged, Toolkit, create_toolkit, tool
from toolmesh.capabilities import CapabilitySet
from toolmesh.mcp.http import MCPHttpEndpoint
from toolmesh.sources.http import HttpEndpoint, http_tool
from toolmesh.sources.javascript import JavaScriptSource


@tool(tags=["fs"], capabilities=["fs"])
def ls(path: str = ".") -> str:
    """List files."""
    return path


def _plain(a: int = 0) -> int:
    return a


URL = "https://example.com"


def _names(kit: Toolkit, tags: Any = ()) -> list[str]:
    return [d.name for d in kit.definitions(tags=tags)]


def _search(kit: Toolkit, tags: Any) -> list[str]:
    return [t.name for t in kit.search("files", tags=tags)]


# (the setting, a lone string for it, how to read what it became, what that must be)
CASES: list[tuple[str, str, Callable[[Any], Any], Any]] = [
    ("tool tags", "network", lambda s: tool(_plain, tags=s).definition.tags, ["network"]),
    (
        "tool capabilities",
        "fs",
        lambda s: tool(_plain, capabilities=s).definition.capabilities,
        ["fs"],
    ),
    ("Toolkit capabilities", "fs", lambda s: Toolkit(capabilities=s).capabilities.tags, {"fs"}),
    ("Toolkit keep_active", "ls*", lambda s: Toolkit(keep_active=s).keep_active, ("ls*",)),
    (
        "Toolkit state_paths",
        "/ctx/",
        lambda s: Toolkit(state_paths=s).state.allowed_prefixes,
        ("/ctx/",),
    ),
    ("Toolkit.search tags", "fs", lambda s: _search(Toolkit(ls), s), ["ls"]),
    ("Toolkit.definitions tags", "fs", lambda s: _names(Toolkit(ls), tags=s), ["ls"]),
    ("Host capabilities", "fs", lambda s: Host(ls, capabilities=s).capabilities.tags, {"fs"}),
    ("CapabilitySet", "fs", lambda s: CapabilitySet(s).tags, {"fs"}),
    ("Filtered allow", "ls", lambda s: _names(Toolkit(Filtered(ls, allow=s))), ["ls"]),
    ("Filtered deny", "ls", lambda s: _names(Toolkit(Filtered(ls, deny=s))), []),
    (
        "Tagged tags",
        "more",
        lambda s: Toolkit(Tagged(ls, tags=s))["ls"].definition.tags,
        ["fs", "more"],
    ),
    ("http_tool tags", "web", lambda s: http_tool("h", URL, tags=s).definition.tags, ["web"]),
    ("HttpEndpoint tags", "web", lambda s: HttpEndpoint("h", URL, tags=s).tags, ["web"]),
    (
        "MCP allowed_origins",
        URL,
        lambda s: MCPHttpEndpoint(Host(ls), allowed_origins=s).allowed_origins,
        {URL},
    ),
]


@pytest.mark.parametrize(("setting", "given", "read", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_lone_string_is_one_item(
    setting: str, given: str, read: Callable[[Any], Any], expected: Any
) -> None:
    assert read(given) == expected
    assert read([given]) == expected  # as a list of it says


async def test_create_toolkit_capabilities_take_a_lone_string() -> None:
    async with await create_toolkit(tools=[ls], capabilities="fs") as kit:
        assert kit.capabilities.tags == {"fs"}


def test_a_lone_folder_is_one_folder(tmp_path: Path) -> None:
    source = JavaScriptSource(tmp_path, allow_read="data", allow_write=tmp_path / "out")
    assert source.allow_read == [str(Path("data").resolve())]
    assert source.allow_write == [str(tmp_path / "out")]


@pytest.mark.parametrize("given", [5, [b"fs"], ["fs", None]])
def test_anything_but_strings_is_refused_naming_the_setting(given: Any) -> None:
    with pytest.raises(ConfigError, match=r"^tags must be a string or a list of strings, not "):
        Toolkit(ls).search("files", tags=given)
    with pytest.raises(ConfigError, match=r"Filtered deny must be a string or a list of strings"):
        Filtered(ls, deny=given)
