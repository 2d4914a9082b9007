"""MCP call results <-> toolmesh results, both ways."""

from __future__ import annotations

from mcp_types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from toolmesh import ToolContext, ToolEvent, ToolResult
from toolmesh.mcp.results import ERROR_CODE_META_KEY, mcp_call_result, result_from_mcp


def test_every_kind_of_content_is_kept() -> None:
    ctx = ToolContext(tool_name="t")
    result = result_from_mcp(
        CallToolResult(
            content=[
                TextContent(type="text", text="first"),
                ImageContent(type="image", data="aW1n", mime_type="image/png"),
                EmbeddedResource(
                    type="resource",
                    resource=TextResourceContents(
                        uri="file:///a.txt", mime_type="text/plain", text="A"
                    ),
                ),
                EmbeddedResource(
                    type="resource",
                    resource=BlobResourceContents(
                        uri="file:///b.bin", mime_type="application/zip", blob="Qg=="
                    ),
                ),
                ResourceLink(type="resource_link", uri="file:///c", name="c"),
                TextContent(type="text", text="second"),
            ],
            structured_content={"n": 1},
        ),
        ctx,
        tool_name="t",
    )
    assert result.success and result.data == {"n": 1}
    assert result.output == "first\nsecond"
    artifacts = [(e.data["name"], e.data["mime"], e.data["chunk"]) for e in ctx.events]
    assert artifacts == [
        ("image-1", "image/png", "aW1n"),
        ("file:///a.txt", "text/plain", "A"),
        ("file:///b.bin", "application/zip;base64", "Qg=="),
    ]
    assert result.metadata["resource_links"][0]["uri"] == "file:///c"


def test_is_error_becomes_a_tool_error_with_the_text() -> None:
    failed = result_from_mcp(
        CallToolResult(content=[TextContent(type="text", text="no such city")], is_error=True),
        ToolContext(tool_name="t"),
        tool_name="t",
    )
    assert not failed.success and failed.error == "no such city"
    assert failed.error_code == "tool_error"
    silent = result_from_mcp(
        CallToolResult(content=[], is_error=True), ToolContext(tool_name="t"), tool_name="t"
    )
    assert "without a message" in (silent.error or "")


def test_toolmesh_results_as_mcp_results() -> None:
    ok = ToolResult(success=True, tool_name="t", data={"a": 1}, duration_ms=1)
    assert mcp_call_result(ok, modern=False) == {
        "content": [{"type": "text", "text": '{"a": 1}'}],
        "isError": False,
        "structuredContent": {"a": 1},
    }
    image = ToolEvent(
        kind="artifact",
        data={"name": "image-0", "mime": "image/png", "chunk": "aW1n", "final": True},
    )
    blob = ToolEvent(
        kind="artifact",
        data={"name": "file:///b", "mime": "text/csv;base64", "chunk": "YQ==", "final": True},
    )
    with_parts = ToolResult(
        success=True, tool_name="t", data="", events=[image, blob], duration_ms=1
    )
    wire = mcp_call_result(with_parts, modern=True)
    assert wire["resultType"] == "complete"
    assert wire["content"] == [
        {"type": "image", "data": "aW1n", "mimeType": "image/png"},
        {
            "type": "resource",
            "resource": {"uri": "file:///b", "mimeType": "text/csv", "blob": "YQ=="},
        },
    ]
    denied = ToolResult(
        success=False, tool_name="t", error="no", error_code="tool_denied", duration_ms=1
    )
    wire = mcp_call_result(denied, modern=False)
    assert wire["isError"] and wire["content"][0]["text"] == "no"
    assert wire["_meta"][ERROR_CODE_META_KEY] == "tool_denied"


def test_an_error_told_only_in_structured_content_keeps_its_details() -> None:
    """An isError answer with no text but structuredContent became "reported an error without
    a message": the details (a code, say) reached nobody."""
    failed = result_from_mcp(
        CallToolResult(content=[], is_error=True, structured_content={"code": "E42"}),
        ToolContext(tool_name="t"),
        tool_name="t",
    )
    assert not failed.success and failed.error == '{"code": "E42"}'
    assert failed.data == {"code": "E42"}
    wire = mcp_call_result(failed, modern=False)  # and the gateway passes them on
    assert wire["isError"] is True and wire["structuredContent"] == {"code": "E42"}


def test_resource_links_from_an_upstream_server_pass_through_the_gateway() -> None:
    """The inbound side kept them in metadata; the outbound side dropped them."""
    ctx = ToolContext(tool_name="t")
    link = ResourceLink(type="resource_link", uri="file:///c", name="c")
    inbound = result_from_mcp(
        CallToolResult(content=[TextContent(type="text", text="see"), link]), ctx, tool_name="t"
    )
    wire = mcp_call_result(inbound, modern=False)
    assert wire["content"] == [
        {"type": "text", "text": "see"},
        {"type": "resource_link", "uri": "file:///c", "name": "c"},
    ]
