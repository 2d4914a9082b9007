"""Agent cards: fetching one, and reading where and how its agent is reached.

The JSON-RPC endpoint is the card's A2A 1.0 ``supportedInterfaces`` entry for JSON-RPC, else its
v0.3 ``url``, else the origin of the URL the card was fetched from. Which dialect the peer speaks
(1.0 or v0.3) comes from the same entry; a peer that turns out to speak the other one is
switched to on its first answer (see ``remote.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from toolmesh.errors import ConfigError, TransportError, excerpt
from toolmesh.transports.bodies import read_at_most

__all__ = [
    "MAX_CARD_BYTES",
    "WELL_KNOWN_CARD",
    "Endpoint",
    "endpoint_of",
    "fetch_card",
    "skills_of",
]

WELL_KNOWN_CARD = "/.well-known/agent-card.json"
MAX_CARD_BYTES = 1024 * 1024

Dialect = Literal["1.0", "0.3"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where an agent takes JSON-RPC requests, in which dialect, and whether it streams."""

    url: str
    dialect: Dialect
    streaming: bool


async def fetch_card(card_url: str, headers: Mapping[str, str], timeout_s: float) -> dict[str, Any]:
    """GET the agent card at ``card_url``; unreachable -> TransportError, not a card (or one
    larger than ``MAX_CARD_BYTES``, not read past that) -> ConfigError."""
    try:
        async with (
            httpx.AsyncClient(timeout=timeout_s, follow_redirects=True) as http,
            http.stream("GET", card_url, headers=dict(headers)) as response,
        ):
            body, cut = await read_at_most(response, MAX_CARD_BYTES)
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__  # httpx's timeouts have no message
        raise TransportError(f"cannot fetch the agent card {card_url}: {reason}") from exc
    if response.status_code != 200:
        said = excerpt(body.decode("utf-8", "replace"))
        raise TransportError(f"the agent card {card_url} answered {response.status_code}: {said}")
    if cut:
        raise ConfigError(
            f"the agent card {card_url} is larger than {MAX_CARD_BYTES} bytes; not read on"
        )
    try:
        card = json.loads(body)
    except ValueError as exc:  # not JSON, or not UTF-8 either
        raise ConfigError(f"the agent card {card_url} is not JSON: {exc}") from exc
    if not isinstance(card, dict):
        raise ConfigError(f"the agent card {card_url} is not a JSON object")
    return card


def check_card(card: Any, card_url: str) -> dict[str, Any]:
    """The card, or ConfigError saying what makes it unusable."""
    if not isinstance(card, dict):
        raise ConfigError(f"the agent card {card_url} is not a JSON object")
    if not isinstance(card.get("name"), str) or not card["name"].strip():
        raise ConfigError(f"the agent card {card_url} has no name")
    if not isinstance(card.get("skills", []), list):
        raise ConfigError(f"the agent card {card_url} has a 'skills' that is not a list")
    return card


def skills_of(card: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The card's skills that have an id or a name."""
    return [
        s
        for s in card.get("skills") or []
        if isinstance(s, dict) and (_text(s.get("id")) or _text(s.get("name")))
    ]


def endpoint_of(card: Mapping[str, Any], card_url: str) -> Endpoint:
    capabilities = card.get("capabilities")
    streaming = isinstance(capabilities, dict) and capabilities.get("streaming") is True
    interfaces = [
        i
        for i in card.get("supportedInterfaces") or card.get("supported_interfaces") or []
        if isinstance(i, dict) and _text(i.get("url"))
    ]
    jsonrpc = [
        i
        for i in interfaces
        if _binding(i.get("protocolBinding") or i.get("protocol_binding")) == "JSONRPC"
    ]
    for interface in jsonrpc:
        if _dialect(interface.get("protocolVersion") or interface.get("protocol_version")) == "1.0":
            return Endpoint(interface["url"], "1.0", streaming)
    legacy = _dialect(card.get("protocolVersion") or card.get("protocol_version"))
    # v0.3: ``url`` serves the ``preferredTransport`` (JSON-RPC when not said), and
    # ``additionalInterfaces`` the others: a gRPC or REST ``url`` is no JSON-RPC endpoint.
    preferred = _binding(card.get("preferredTransport") or card.get("preferred_transport"))
    if _text(card.get("url")) and preferred == "JSONRPC":
        return Endpoint(card["url"], legacy, streaming)
    additional = [
        i
        for i in card.get("additionalInterfaces") or card.get("additional_interfaces") or []
        if isinstance(i, dict) and _text(i.get("url"))
    ]
    for interface in additional:
        if _binding(interface.get("transport")) == "JSONRPC":
            return Endpoint(interface["url"], legacy, streaming)
    if jsonrpc:
        version = jsonrpc[0].get("protocolVersion") or jsonrpc[0].get("protocol_version")
        return Endpoint(jsonrpc[0]["url"], _dialect(version), streaming)
    offered = {_binding(i.get("protocolBinding") or i.get("protocol_binding")) for i in interfaces}
    offered |= {_binding(i.get("transport")) for i in additional}
    if _text(card.get("url")):
        offered.add(preferred)
    if offered:  # posting JSON-RPC to the card's origin would only fail less clearly
        raise ConfigError(
            f"the agent card {card_url} offers no JSON-RPC interface, only "
            f"{', '.join(sorted(offered))}: toolmesh speaks A2A over JSON-RPC"
        )
    parts = urlsplit(card_url)
    if not parts.scheme or not parts.netloc:
        raise ConfigError(f"cannot find the agent's endpoint: {card_url!r} is not a URL")
    return Endpoint(f"{parts.scheme}://{parts.netloc}", "1.0", streaming)


def _binding(value: Any) -> str:
    """A protocol binding (transport) name as compared: JSON-RPC when not said."""
    return str(value or "JSONRPC").strip().upper()


def _dialect(version: Any) -> Dialect:
    text = str(version or "1.0").strip()
    return "0.3" if text.startswith("0.") else "1.0"


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""
