"""A remote agent as a toolkit source: its card is fetched when the toolkit starts.

A card that cannot be fetched or read leaves the source ``failed`` (with the reason) and
serving no tools; the toolkit carries on with its other sources.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from toolmesh.a2a.card import check_card, endpoint_of
from toolmesh.a2a.remote import Agent, Peer, tools_from_card
from toolmesh.sources.base import Source, SourceStatus
from toolmesh.tools import Tool

__all__ = ["AgentSource"]

logger = logging.getLogger("toolmesh.a2a")


class AgentSource(Source):
    """The skills of one remote A2A agent, as tools."""

    def __init__(self, ag: Agent) -> None:
        self.agent = ag
        self.name = f"a2a:{ag.name or ag.card_url}"
        self.status = SourceStatus("pending")
        self.card: dict[str, object] = {}
        self._tools: list[Tool] = []
        self._peer: Peer | None = None
        self._epoch = 0  # bumped by close(): an open begun before it keeps nothing

    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def open(self) -> None:
        from toolmesh import a2a as package  # looked up here so _fetch_card can be replaced

        url = self.agent.card_url
        epoch = self._epoch
        try:
            card = check_card(
                await package._fetch_card(
                    url, dict(self.agent.headers), min(self.agent.timeout, 30.0)
                ),
                url,
            )
            peer = Peer(endpoint_of(card, url), self.agent.headers)
            tools = tools_from_card(self.agent, card, url, peer)
        except Exception as exc:  # a failing agent never breaks the toolkit
            self.status = SourceStatus("failed", f"{url}: {exc}")
            logger.warning("A2A agent %s is unavailable: %s", url, exc)
            return
        if epoch != self._epoch:  # closed while the card was fetched: open no client
            self.status = SourceStatus("failed", f"{url}: closed before the card arrived")
            return
        previous = self._peer
        peer.open()  # installed before any await, so a close meanwhile closes this one
        self.card, self._peer, self._tools = card, peer, tools
        self.status = SourceStatus("connected")
        if previous is not None:
            await previous.close()
        self.changed()

    async def close(self) -> None:
        self._epoch += 1
        await self._release()

    async def _release(self) -> None:
        if self._peer is not None:
            await self._peer.close()
            self._peer = None
