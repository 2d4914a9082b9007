"""The tool_search tools: natural language and regex, returning definitions to load."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolmesh import Tool, ToolDefinition, Toolkit, ToolParameter
from toolmesh.capabilities import CapabilitySet
from toolmesh.session import Session


def make(name: str, description: str, **changes: Any) -> Tool:
    async def run(arguments: dict[str, Any], ctx: Any) -> str:
        return name

    definition = ToolDefinition(name=name, description=description, **changes)
    return Tool(definition, run)


def catalogue() -> Toolkit:
    return Toolkit(
        make("github_create_issue", "Create an issue in a GitHub repository", defer_loading=True),
        make("github_list_issues", "List the issues of a repository", defer_loading=True),
        make(
            "slack_post_message",
            "Post a message to a channel",
            defer_loading=True,
            input_parameters=[
                ToolParameter(name="channel_id", type="string", description="Slack channel")
            ],
        ),
        make("vault_read", "Read a secret", capabilities=["vault"], defer_loading=True),
        make("echo", "Say it back"),
        make("long", "x" * 60 + "!", defer_loading=True),  # a pathological pattern's victim
        tool_search=True,
        capabilities=["*"],
    )


async def test_natural_language_search_returns_definitions_to_load() -> None:
    kit = catalogue()
    assert [d.name for d in kit.definitions()] == ["tool_search", "tool_search_regex", "echo"]
    result = await kit.execute("tool_search", {"query": "create an issue on github", "limit": 1})
    assert result.success, result.error
    (found,) = result.data["tools"]
    assert found["name"] == "github_create_issue"
    assert found["input_schema"]["type"] == "object"
    assert result.metadata["tool_references"] == ["github_create_issue"]
    assert "github_create_issue" in result.output


async def test_regex_search_over_names_descriptions_and_parameters() -> None:
    kit = catalogue()
    result = await kit.execute("tool_search_regex", {"pattern": "^github_"})
    assert [d["name"] for d in result.data["tools"]] == [
        "github_create_issue",
        "github_list_issues",
    ]
    by_parameter = await kit.execute("tool_search_regex", {"pattern": "CHANNEL_ID"})
    assert [d["name"] for d in by_parameter.data["tools"]] == ["slack_post_message"]
    none = await kit.execute("tool_search_regex", {"pattern": "zebra"})
    assert none.success
    assert none.data == {"tools": []}


async def test_only_tools_the_session_may_call_and_never_itself() -> None:
    kit = catalogue()
    session = Session(capabilities=CapabilitySet(["tools"]), agent_id="a")
    for name, args in (
        ("tool_search", {"query": "secret"}),
        ("tool_search_regex", {"pattern": "."}),
    ):
        result = await kit.execute(name, args, session=session)
        names = [d["name"] for d in result.data["tools"]]
        assert "vault_read" not in names
        assert not {"tool_search", "tool_search_regex"} & set(names)
    allowed = await kit.execute("tool_search", {"query": "read a secret"})
    assert allowed.data["tools"][0]["name"] == "vault_read"


async def test_the_search_tools_are_listed_but_never_found_by_searching() -> None:
    # Their own descriptions' examples ("create a GitHub issue", "^slack_") made them the hits
    # of searches for tools that are not there.
    kit = Toolkit(make("read_file", "Read a text file"), tool_search=True)
    assert [d.name for d in kit.definitions()] == ["tool_search", "tool_search_regex", "read_file"]
    for query in ("github", "slack", "create an issue", "regular expression", "tool_search"):
        assert kit.search(query) == [], query
    outer = Toolkit(tool_search=True)
    outer.add(kit, prefix="inner")  # nor under another name, from a toolkit inside
    assert "inner_tool_search" in outer and outer.search("github") == []
    assert [t.name for t in outer.search("read a file")] == ["inner_read_file"]
    regex = await outer.execute("tool_search_regex", {"pattern": "search|github"})
    assert regex.success and regex.data == {"tools": []}, regex


async def test_a_whole_float_limit_is_that_limit() -> None:
    # 2.0 passed the schema (an integer for JSON Schema), then failed as a retryable tool_error
    kit = catalogue()
    natural = await kit.execute("tool_search", {"query": "issues", "limit": 1.0})
    regex = await kit.execute("tool_search_regex", {"pattern": "^github_", "limit": 2.0})
    assert natural.success and len(natural.data["tools"]) == 1, natural
    assert regex.success and len(regex.data["tools"]) == 2, regex


@pytest.mark.parametrize(
    ("name", "arguments", "message", "code"),
    [
        ("tool_search_regex", {"pattern": "("}, "not a valid regular expression", "tool_error"),
        ("tool_search_regex", {"pattern": "a" * 201}, "$.pattern", "invalid_arguments"),
        ("tool_search_regex", {"pattern": "(x|xx)+$"}, "took longer than 1s", "tool_error"),
        ("tool_search", {"query": "  "}, "$.query", "invalid_arguments"),  # not worth a retry
        ("tool_search", {"query": ""}, "$.query", "invalid_arguments"),
        ("tool_search", {"query": "issue", "limit": 0}, "$.limit", "invalid_arguments"),
        ("tool_search", {"query": "issue", "limit": 21}, "$.limit", "invalid_arguments"),
    ],
)
async def test_bad_input_is_a_failed_result(
    name: str, arguments: dict[str, Any], message: str, code: str
) -> None:
    result = await catalogue().execute(name, arguments)
    assert not result.success and result.error_code == code
    assert message in (result.error or "") or message == result.metadata.get("path")


async def test_a_slow_pattern_does_not_hold_up_the_event_loop() -> None:
    kit = catalogue()
    ticks = 0
    searching = asyncio.ensure_future(kit.execute("tool_search_regex", {"pattern": "(x|xx)+$"}))
    while not searching.done():  # the loop keeps turning while the pattern runs
        ticks += 1
        await asyncio.sleep(0)
    assert "took longer than 1s" in ((await searching).error or "")
    assert ticks > 1
