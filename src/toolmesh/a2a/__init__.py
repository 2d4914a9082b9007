"""A2A both ways: remote agents as tools, and a toolkit served as an A2A agent.

Outbound: ``agent(card_url)`` describes a remote agent, ``await agent_tools(ag)`` fetches its card
(through ``_fetch_card``, which tests may replace) and gives one Tool per skill;
``create_toolkit(agents=[...])`` and ``toolkit.add_agent(...)`` register them, and
``parse_agents_config`` reads them from configuration. Inbound: ``toolkit.serve(...,
a2a={"name": ...})`` (see ``toolmesh.a2a.server``). Only httpx is needed; the a2a-sdk is not.
"""

from toolmesh.a2a.card import fetch_card as _fetch_card
from toolmesh.a2a.config import parse_agents_config
from toolmesh.a2a.remote import Agent, agent, agent_tools
from toolmesh.a2a.source import AgentSource

__all__ = ["Agent", "AgentSource", "_fetch_card", "agent", "agent_tools", "parse_agents_config"]
