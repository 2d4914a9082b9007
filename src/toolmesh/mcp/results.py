"""MCP call results <-> toolmesh ToolResults, both ways.

From MCP: ``isError`` becomes a failed result whose error is the text the server gave;
``structuredContent`` becomes ``data`` (the joined text otherwise); text blocks are joined for
``output``; images, audio and embedded resources become ``artifact`` events and resource links
are kept in ``metadata["resource_links"]``.

To MCP: ``output`` becomes a text block, artifacts become image/audio/resource blocks again, an
object ``data`` becomes ``structuredContent`` and a failure becomes ``isError`` with the error
text, so a model can read what went wrong.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mcp_types import (
    AudioContent,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from toolmesh.models import ToolErrorCode, ToolEvent, ToolResult

if TYPE_CHECKING:
    from toolmesh.tools import ToolContext

__all__ = ["ERROR_CODE_META_KEY", "mcp_call_result", "result_from_mcp"]

ERROR_CODE_META_KEY = "io.toolmesh/errorCode"


_MEDIA = (ImageContent, AudioContent)


def result_from_mcp(result: CallToolResult, ctx: ToolContext, *, tool_name: str) -> ToolResult:
    """The ToolResult of an MCP ``tools/call`` answer; non-text parts are emitted as artifacts."""
    texts: list[str] = []
    links: list[dict[str, Any]] = []
    for index, block in enumerate(result.content):
        if isinstance(block, TextContent):
            texts.append(block.text)
        elif isinstance(block, _MEDIA):
            ctx.artifact(f"{block.type}-{index}", block.data, mime=block.mime_type)
        elif isinstance(block, EmbeddedResource):
            resource = block.resource
            mime = resource.mime_type or "application/octet-stream"
            if isinstance(resource, TextResourceContents):
                ctx.artifact(str(resource.uri), resource.text, mime=mime)
            else:
                ctx.artifact(str(resource.uri), resource.blob, mime=f"{mime};base64")
        elif isinstance(block, ResourceLink):
            links.append(block.model_dump(by_alias=True, mode="json", exclude_none=True))
    text = "\n".join(texts)
    metadata: dict[str, Any] = {"resource_links": links} if links else {}
    structured = result.structured_content
    if result.is_error:
        if not text and structured is not None:  # the details are the structured content
            text = json.dumps(structured, ensure_ascii=False, default=str)
        return ToolResult(
            success=False,
            tool_name=tool_name,
            error=text or "the MCP tool reported an error without a message",
            error_code=ToolErrorCode.TOOL_ERROR,
            data=structured,
            metadata=metadata,
            duration_ms=0,
        )
    return ToolResult(
        success=True,
        tool_name=tool_name,
        data=structured if structured is not None else text,
        output=text if texts or structured is None else None,
        metadata=metadata,
        duration_ms=0,
    )


def mcp_call_result(result: ToolResult, *, modern: bool) -> dict[str, Any]:
    """The ``tools/call`` result (wire form) of a toolmesh result."""
    if not result.success:
        wire: dict[str, Any] = {
            "content": [{"type": "text", "text": result.error or result.output or "failed"}],
            "isError": True,
            "_meta": {ERROR_CODE_META_KEY: result.error_code or ToolErrorCode.TOOL_ERROR},
        }
    else:
        content: list[dict[str, Any]] = []
        text = result.output
        if text or not result.events:
            content.append({"type": "text", "text": text})
        content.extend(_artifact_blocks(result.events))
        wire = {"content": content, "isError": False}
    # what an upstream server sent passes on: its resource links, its structured content (an
    # error's too: clients check only a success's against the output schema)
    links = result.metadata.get("resource_links") if result.metadata else None
    if isinstance(links, list):
        wire["content"].extend(
            link for link in links if isinstance(link, dict) and link.get("type") == "resource_link"
        )
    if isinstance(result.data, dict):
        wire["structuredContent"] = result.data
    if modern:
        wire["resultType"] = "complete"
    return wire


def _artifact_blocks(events: list[ToolEvent]) -> list[dict[str, Any]]:
    """Artifacts as MCP content blocks; chunks of one artifact are joined first."""
    parts: dict[str, list[str]] = {}
    mimes: dict[str, str] = {}
    for event in events:
        if event.kind != "artifact":
            continue
        name = str(event.data.get("name", "artifact"))
        parts.setdefault(name, []).append(str(event.data.get("chunk", "")))
        mimes[name] = str(event.data.get("mime", "text/plain"))
    return [_block(name, "".join(chunks), mimes[name]) for name, chunks in parts.items()]


def _block(name: str, chunk: str, mime: str) -> dict[str, Any]:
    base64 = mime.endswith(";base64")
    bare = mime.removesuffix(";base64")
    if bare.startswith(("image/", "audio/")) and not name.startswith(("file:", "http")):
        return {"type": bare.split("/", 1)[0], "data": chunk, "mimeType": bare}
    uri = name if ":" in name else f"toolmesh://artifact/{name}"
    contents: dict[str, Any] = {"uri": uri, "mimeType": bare}
    contents["blob" if base64 else "text"] = chunk
    return {"type": "resource", "resource": contents}
