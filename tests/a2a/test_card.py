"""Reading agent cards: the endpoint rules and unusable cards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fixtures.sites import static_site
from toolmesh import ConfigError, TransportError, agent
from toolmesh.a2a.card import check_card, endpoint_of, fetch_card
from toolmesh.errors import EXCERPT_CHARS, excerpt

CARD_URL = "http://127.0.0.1:8080/.well-known/agent-card.json"


def test_endpoint_rules() -> None:
    v10 = {"url": "http://a/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    v03 = {"url": "http://b/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}
    grpc = {"url": "http://c/rpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"}
    both = {"supportedInterfaces": [v03, grpc, v10], "url": "http://b/rpc"}
    assert endpoint_of(both, CARD_URL).url == "http://a/rpc"
    assert endpoint_of(both, CARD_URL).dialect == "1.0"
    legacy = endpoint_of({"url": "http://old/", "protocolVersion": "0.3.0"}, CARD_URL)
    assert (legacy.url, legacy.dialect) == ("http://old/", "0.3")
    assert endpoint_of({"supportedInterfaces": [v03]}, CARD_URL).dialect == "0.3"
    fallback = endpoint_of({"capabilities": {"streaming": True}}, CARD_URL)
    assert (fallback.url, fallback.dialect, fallback.streaming) == (
        "http://127.0.0.1:8080",
        "1.0",
        True,
    )
    with pytest.raises(ConfigError, match="not a URL"):
        endpoint_of({}, "card.json")


def test_unusable_cards() -> None:
    with pytest.raises(ConfigError, match="no name"):
        check_card({"skills": []}, CARD_URL)
    with pytest.raises(ConfigError, match="not a list"):
        check_card({"name": "x", "skills": {}}, CARD_URL)
    with pytest.raises(ConfigError, match="not a JSON object"):
        check_card([], CARD_URL)


def test_a_bare_origin_gets_the_well_known_path() -> None:
    assert agent("http://h:1").card_url == "http://h:1/.well-known/agent-card.json"
    assert agent("http://h:1/cards/x.json").card_url == "http://h:1/cards/x.json"
    with pytest.raises(ConfigError, match="poll_every"):
        agent("http://h:1", poll_every=0)


async def test_fetch_failures() -> None:
    with pytest.raises(TransportError, match="cannot fetch"):
        await fetch_card("http://127.0.0.1:9/.well-known/agent-card.json", {}, 5)


def test_a_v03_card_whose_url_is_not_json_rpc_uses_its_json_rpc_interface() -> None:
    """A v0.3 card's ``url`` serves its ``preferredTransport``; the JSON-RPC endpoint of a card
    preferring gRPC is in ``additionalInterfaces`` (the gRPC address was posted JSON-RPC to)."""
    card = {
        "url": "grpc.example:443",
        "preferredTransport": "GRPC",
        "protocolVersion": "0.3.0",
        "additionalInterfaces": [
            {"url": "grpc.example:443", "transport": "GRPC"},
            {"url": "http://example/jsonrpc", "transport": "JSONRPC"},
        ],
    }
    found = endpoint_of(card, CARD_URL)
    assert (found.url, found.dialect) == ("http://example/jsonrpc", "0.3")
    plain = endpoint_of({"url": "http://old/", "preferredTransport": "JSONRPC"}, CARD_URL)
    assert plain.url == "http://old/"


@pytest.mark.parametrize(
    "card",
    [
        {"supportedInterfaces": [{"url": "http://a/v1", "protocolBinding": "HTTP+JSON"}]},
        {"url": "grpc.example:443", "preferredTransport": "GRPC", "protocolVersion": "0.3.0"},
    ],
)
def test_a_card_without_a_json_rpc_interface_is_named(card: dict[str, object]) -> None:
    """A card offering only REST or gRPC fell back to the card's origin, and every call then
    failed with whatever that origin answers to a JSON-RPC post."""
    with pytest.raises(ConfigError, match="offers no JSON-RPC interface"):
        endpoint_of(card, CARD_URL)


async def test_a_card_answered_with_an_html_page_is_named_in_one_short_line(
    tmp_path: Path,
) -> None:
    """The 404 page of a plain web site was quoted whole, line breaks and all."""
    with static_site(tmp_path) as site, pytest.raises(TransportError) as refused:
        await fetch_card(f"{site}/missing.json", {}, 5)
    said = f"the agent card {site}/missing.json answered 404: "
    assert refused.value.message.startswith(said + "<!DOCTYPE HTML> <html lang=")
    quoted = refused.value.message[len(said) :]
    assert "\n" not in quoted and len(quoted) == EXCERPT_CHARS and quoted.endswith("...")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("short", "short"),
        ("  a\n\n  b\tc \r\n", "a b c"),
        ("x" * 250, "x" * 197 + "..."),
        (" " * 5000 + "late", ""),  # only the start is read: a body may be megabytes
    ],
)
def test_excerpt(text: str, shown: str) -> None:
    assert excerpt(text) == shown


async def test_a_card_past_the_limit_is_refused_without_reading_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 1 MB limit was checked once the whole card was in memory (a 300 MB card took 700 MB):
    past MAX_CARD_BYTES it is refused at once (this card stalls after its first bytes: reading
    on would wait), and its source fails naming the limit."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from tests.fixtures.web import serve_app
    from toolmesh import create_toolkit
    from toolmesh.a2a import AgentSource, card

    monkeypatch.setattr(card, "MAX_CARD_BYTES", 1000)
    ended = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b'{"name": "big", "description": "' + b"x" * 5000
        await ended.wait()

    async def big_card(request: object) -> StreamingResponse:
        return StreamingResponse(stalled(), media_type="application/json")

    app = Starlette(routes=[Route("/.well-known/agent-card.json", big_card)])
    async with serve_app(app) as base:
        try:
            async with asyncio.timeout(10):  # the old fetch waited for the rest
                with pytest.raises(ConfigError, match="larger than 1000 bytes; not read on"):
                    await fetch_card(f"{base}/.well-known/agent-card.json", {}, 30)
                kit = await create_toolkit(agents=[f"{base}/.well-known/agent-card.json"])
                async with kit:
                    (source,) = [s for s in kit.sources if isinstance(s, AgentSource)]
        finally:
            ended.set()
    assert source.status.state == "failed"
    assert "is larger than 1000 bytes" in source.status.reason
