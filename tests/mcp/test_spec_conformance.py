"""Spec points of the MCP server found by a QA pass: an ``outputSchema`` promise kept when the
output limit drops the data, and ``MCP-Protocol-Version`` checked on every HTTP method."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TypedDict

import httpx
import pytest
from mcp import Client, MCPError

from toolmesh import Host, Limits, tool
from toolmesh.mcp.http import mcp_routes
from toolmesh.transports.http import HttpServer

pytestmark = [pytest.mark.network_server]


class Report(TypedDict):
    n: int
    text: str


@tool
def report(n: int) -> Report:
    """A structured report of n characters."""
    return {"n": n, "text": "x" * n}


@tool
def plain(text: str) -> str:
    """Text back."""
    return text


@contextlib.asynccontextmanager
async def endpoint() -> AsyncIterator[str]:
    host = Host(report, plain, limits=Limits(max_output_chars=200))
    server = HttpServer(host, "127.0.0.1:0", extra_routes=mcp_routes(host))
    url = await server.start()
    try:
        yield f"{url}/mcp"
    finally:
        await server.stop()
        await host.close()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_cut_off_structured_result_is_an_error_not_a_broken_promise(mode: str) -> None:
    # "If an output schema is provided: Servers MUST provide structured results that conform to
    # this schema." The SDK's client raised RuntimeError on the success without them.
    async with endpoint() as url, Client(url, mode=mode) as client:
        listing = await client.list_tools(cache_mode="bypass")
        assert {t.name: t for t in listing.tools}["report"].output_schema is not None
        small = await client.call_tool("report", {"n": 3})
        assert not small.is_error and small.structured_content == {"n": 3, "text": "xxx"}

        cut = await client.call_tool("report", {"n": 1000})
        assert cut.is_error
        text = cut.content[0].text  # type: ignore[union-attr]
        assert "outputSchema" in text and "larger than the output limit" in text
        assert "[output truncated" in text  # what there was is still shown

        long_text = await client.call_tool("plain", {"text": "y" * 1000})
        assert not long_text.is_error  # no outputSchema listed: a cut-off text stays a success


async def test_unsupported_protocol_version_is_400_on_get_and_delete() -> None:
    # "If the server receives a request with an invalid or unsupported MCP-Protocol-Version,
    # it MUST respond with 400 Bad Request." GET answered 405; DELETE ended the session.
    accept = {"Accept": "application/json, text/event-stream"}
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
    }
    async with endpoint() as url, httpx.AsyncClient(timeout=10) as http:
        opened = await http.post(url, headers=accept, json=hello)
        session = {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
        wrong = {**accept, **session, "MCP-Protocol-Version": "1999-01-01"}

        stream = await http.get(url, headers={**wrong, "Accept": "text/event-stream"})
        assert stream.status_code == 400
        assert "1999-01-01" in stream.json()["error"]["message"]

        ended = await http.delete(url, headers=wrong)
        assert ended.status_code == 400

        right = {**accept, **session, "MCP-Protocol-Version": "2025-06-18"}
        ping = await http.post(
            url, headers=right, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}
        )
        assert ping.status_code == 200 and ping.json()["result"] == {}  # the session lives on
        assert (await http.delete(url, headers=right)).status_code == 200


async def test_a_cursor_never_given_out_is_invalid_params() -> None:
    # Pagination: "Invalid cursors SHOULD result in an error with code -32602". The listing is
    # one page, so no cursor was ever handed out; one used to get the whole listing again.
    async with endpoint() as url, Client(url, mode="legacy") as client:
        listing = await client.list_tools(cache_mode="bypass")
        assert listing.next_cursor is None
        with pytest.raises(MCPError) as refused:
            await client.list_tools(cursor="page-2", cache_mode="bypass")
        assert refused.value.code == -32602 and "page-2" in str(refused.value)


def _batch(*messages: dict[str, object]) -> list[dict[str, object]]:
    return [{"jsonrpc": "2.0", **m} for m in messages]


async def test_a_2025_03_26_session_takes_json_rpc_batches() -> None:
    # 2025-03-26 (Basic, Messages): implementations "MUST support receiving JSON-RPC batches";
    # 2025-06-18 removed them. They used to be refused as -32600 in every revision.
    accept = {"Accept": "application/json, text/event-stream"}
    async with endpoint() as url, httpx.AsyncClient(timeout=10) as http:
        for version, takes in (("2025-03-26", True), ("2025-06-18", False)):
            hello = {"protocolVersion": version, "capabilities": {}, "clientInfo": {}}
            opened = await http.post(
                url,
                headers=accept,
                json=_batch({"id": 1, "method": "initialize", "params": hello})[0],
            )
            session = {**accept, "Mcp-Session-Id": opened.headers["mcp-session-id"]}
            session["MCP-Protocol-Version"] = version
            batch = _batch(
                {"method": "notifications/initialized"},
                {"id": 2, "method": "ping"},
                {
                    "id": 3,
                    "method": "tools/call",
                    "params": {"name": "plain", "arguments": {"text": "b"}},
                },
                {"id": 4, "method": "no/such/method"},
            )
            answer = await http.post(url, headers=session, json=batch)
            if not takes:
                assert answer.status_code == 400 and answer.json()["error"]["code"] == -32600
                continue
            assert answer.status_code == 200
            by_id = {item["id"]: item for item in answer.json()}
            assert set(by_id) == {2, 3, 4}  # the notification has no answer
            assert by_id[2]["result"] == {}
            assert by_id[3]["result"]["content"][0]["text"] == "b"
            assert by_id[4]["error"]["code"] == -32601
            nested = await http.post(
                url, headers=session, json=[[{"jsonrpc": "2.0", "id": 5, "method": "ping"}]]
            )
            assert nested.json()[0]["error"]["code"] == -32600


async def test_a_2026_result_holding_meta_still_carries_the_server_stamp() -> None:
    # Every 2026-07-28 result is stamped with the server's info in `_meta`; a result with a
    # `_meta` of its own (an error's code) used to go out without the stamp.
    async with endpoint() as url, Client(url, mode="auto") as client:
        assert client.protocol_version == "2026-07-28"
        ok = await client.call_tool("plain", {"text": "a"})
        failed = await client.call_tool("report", {"n": 10_000})  # past the output bound
    stamp = "io.modelcontextprotocol/serverInfo"
    assert ok.meta is not None and stamp in ok.meta
    assert failed.is_error and failed.meta is not None
    assert stamp in failed.meta and failed.meta["io.toolmesh/errorCode"] == "tool_error"
