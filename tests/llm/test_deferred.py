"""Provider-native deferral: Anthropic tool-search tools, OpenAI tool_search and namespaces."""

from __future__ import annotations

import math

import pytest

from toolmesh import ToolDefinition, Toolkit, ToolSet, tool
from toolmesh.llm.deferred import (
    ANTHROPIC_BETA,
    CHARS_PER_TOKEN,
    PER_TOOL_TOKENS,
    anthropic_tool_references,
    estimate_tokens,
    to_anthropic_deferred,
    to_openai_deferred,
)
from toolmesh.llm.formats import to_anthropic, to_openai
from toolmesh.models import ToolResult


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(defer_loading=True)
def create_issue(title: str) -> str:
    """Create a GitHub issue."""
    return title


@tool(defer_loading=True)
def post_message(text: str) -> str:
    """Post a Slack message."""
    return text


def toolkit(**options: object) -> Toolkit:
    kit = Toolkit(add, **options)  # type: ignore[arg-type]
    kit.add(ToolSet([create_issue], name="github"))
    kit.add(ToolSet([post_message], name="slack"))
    return kit


def test_anthropic_server_tool_search() -> None:
    for variant, type_ in (
        ("bm25", "tool_search_tool_bm25_20251119"),
        ("regex", "tool_search_tool_regex_20251119"),
    ):
        tools = to_anthropic_deferred(toolkit(tool_search=True), variant=variant)  # type: ignore[arg-type]
        assert tools[0]["type"] == type_
        assert tools[1] == to_anthropic([add])[0]  # active, in full; toolmesh's search left out
        assert [t["name"] for t in tools[2:]] == ["create_issue", "post_message"]
        assert all(t["defer_loading"] is True for t in tools[2:])
    assert ANTHROPIC_BETA.startswith("advanced-tool-use")


def test_anthropic_with_toolmesh_search() -> None:
    tools = to_anthropic_deferred(toolkit(tool_search=True), variant="toolmesh")
    assert [t["name"] for t in tools] == [
        "tool_search",
        "tool_search_regex",
        "add",
        "create_issue",
        "post_message",
    ]
    assert [bool(t.get("defer_loading")) for t in tools] == [False, False, False, True, True]
    with pytest.raises(ValueError, match="tool_search=True"):
        to_anthropic_deferred(toolkit(), variant="toolmesh")
    with pytest.raises(ValueError, match="variant"):
        to_anthropic_deferred(toolkit(), variant="fuzzy")  # type: ignore[arg-type]


def test_anthropic_tool_references() -> None:
    result = ToolResult(
        success=True, tool_name="tool_search", duration_ms=1, metadata={"tool_references": ["a"]}
    )
    assert anthropic_tool_references(result) == [{"type": "tool_reference", "tool_name": "a"}]


def test_no_deferred_tools_means_no_search_tool() -> None:
    assert to_anthropic_deferred(Toolkit(add)) == to_anthropic([add])
    assert to_openai_deferred(Toolkit(add)) == to_openai([add], api="responses")


def test_openai_responses_tool_search() -> None:
    tools = to_openai_deferred(toolkit())
    assert tools[0] == {"type": "tool_search"}
    assert tools[1] == to_openai([add], api="responses")[0]
    assert [(t["name"], t["defer_loading"]) for t in tools[2:]] == [
        ("create_issue", True),
        ("post_message", True),
    ]


def test_openai_namespaces_group_deferred_tools_by_source() -> None:
    tools = to_openai_deferred(toolkit(), namespaces=True)
    spaces = [t for t in tools if t["type"] == "namespace"]
    assert [s["name"] for s in spaces] == ["github", "slack"]
    assert spaces[0]["tools"][0]["name"] == "create_issue"
    assert spaces[0]["tools"][0]["defer_loading"] is True
    assert "create_issue" in spaces[0]["description"]


def test_openai_chat_has_no_tool_search() -> None:
    tools = to_openai_deferred(toolkit(tool_search=True), api="chat")
    assert [t["function"]["name"] for t in tools] == ["tool_search", "tool_search_regex", "add"]


def test_auto_deferral_reaches_the_provider_shapes() -> None:
    many = [tool(name=f"op_{i}", description="x" * 200)(lambda: None) for i in range(20)]
    kit = Toolkit(*many, defer_above=600)
    tools = to_anthropic_deferred(kit)
    active = [t["name"] for t in tools if "defer_loading" not in t and "type" not in t]
    deferred = [t["name"] for t in tools if t.get("defer_loading")]
    assert active[:2] == ["op_0", "op_1"]
    assert len(active) + len(deferred) == 20
    assert deferred[-1] == "op_19"


def test_estimate_tokens() -> None:
    definition = ToolDefinition(name="n", description="d" * 100)
    expected = math.ceil(
        len(
            '{"name":"n","description":"'
            + "d" * 100
            + '","input_schema":{"type":"object","properties":{}}}'
        )
        / CHARS_PER_TOKEN
    )
    assert estimate_tokens(definition) == expected + PER_TOOL_TOKENS
    assert estimate_tokens(add) > PER_TOOL_TOKENS


def test_toolkit_methods_offer_the_deferred_shapes() -> None:
    kit = toolkit(tool_search=True)
    assert kit.to_anthropic(deferred=True) == to_anthropic_deferred(kit, variant="bm25")
    assert kit.to_anthropic(deferred="regex") == to_anthropic_deferred(kit, variant="regex")
    assert kit.to_openai(api="responses", deferred=True) == to_openai_deferred(kit)
    plain = [t["name"] for t in kit.to_anthropic()]
    assert not any(t.get("defer_loading") for t in kit.to_anthropic())
    assert len(kit.to_anthropic(deferred=True)) > len(plain)
