"""Remote agents declared in configuration, the way MCP servers are declared.

``parse_agents_config`` reads an ``agents`` table (or a mapping holding one)::

    {"agents": {"research": {"card": "https://r.example/.well-known/agent-card.json",
                             "headers": {"Authorization": "Bearer ${RESEARCH_TOKEN}"},
                             "timeout": 120, "poll_every": 2}}}

Precedence: an entry without a string ``card`` is skipped; ``disabled: true`` wins over
``enabled: true``; ``enabled: false`` disables. The key is an identifier only: tool names come
from the card's name. ``${VAR}`` in a header value is taken from the environment.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolmesh.a2a.remote import Agent, agent
from toolmesh.errors import ConfigError
from toolmesh.sources.base import Source

__all__ = ["expand_variables", "parse_agents_config", "sources_from_manifest"]

logger = logging.getLogger("toolmesh.a2a")

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_KNOWN = {"card", "headers", "timeout", "poll_every", "pollEvery", "enabled", "disabled"}
_MANIFEST_KEYS = {"kind", "name"}  # what a [[tools]] entry carries beside the agent's own


def parse_agents_config(cfg: Mapping[str, Any]) -> list[Agent]:
    """The enabled agents of ``cfg`` (``{"agents": {KEY: entry}}`` or ``{KEY: entry}``)."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"the agents configuration must be a mapping, not {type(cfg).__name__}")
    table = cfg.get("agents")
    # {"agents": {"card": URL}} is one agent keyed "agents"; an agent keyed "card" is a table
    if isinstance(table, Mapping) and not isinstance(table.get("card"), str):
        cfg = table
    elif "agents" in cfg and not isinstance(table, Mapping):  # `agents = 5`: not one agent
        raise ConfigError(f"must be a table of agents, not {table!r}", location="agents")
    agents = []
    for key, entry in cfg.items():
        if not isinstance(entry, Mapping):
            logger.debug("agents.%s is not a table; skipped", key)
            continue
        if entry.get("disabled") is True or entry.get("enabled") is False:
            continue
        if not isinstance(entry.get("card"), str):  # a typo would drop the agent unseen
            hint = "; did you mean 'card'?" if "url" in entry or "card_url" in entry else ""
            raise ConfigError(
                f"needs 'card', the URL of the agent's card, as text{hint}",
                location=f"agents.{key}",
            )
        agents.append(_agent(str(key), entry))
    return agents


def _agent(key: str, entry: Mapping[str, Any]) -> Agent:
    where = f"agents.{key}"
    unknown = sorted(set(entry) - _KNOWN - _MANIFEST_KEYS)
    if unknown:
        logger.warning("%s: ignoring unknown settings %s", where, ", ".join(unknown))
    headers = entry.get("headers") or {}
    if not isinstance(headers, Mapping):
        raise ConfigError("'headers' must be a table of text values", location=where)
    timeout = _seconds(entry.get("timeout", 300), "timeout", where)
    poll_every = _seconds(entry.get("poll_every", entry.get("pollEvery", 1.0)), "poll_every", where)
    try:
        return agent(
            entry["card"],
            {str(k): expand_variables(v, f"{where}.headers.{k}") for k, v in headers.items()},
            timeout,
            poll_every,
            name=key,
        )
    except ConfigError as exc:
        raise ConfigError(str(exc), location=where) from None


def _seconds(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{what!r} must be a positive number of seconds", location=where)
    return float(value)


def expand_variables(value: Any, where: str) -> str:
    """``value`` with each ``${VAR}`` replaced from the environment (ConfigError if unset)."""
    if not isinstance(value, str):
        raise ConfigError("header values must be text", location=where)

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ConfigError(f"environment variable {name} is not set", location=where)
        return os.environ[name]

    return _VARIABLE.sub(variable, value)


def sources_from_manifest(entry: Mapping[str, Any], *, base_dir: Path) -> list[Source]:
    """The manifest hook: a ``[[tools]]`` entry of kind a2a (``card`` at its top level or in
    ``config``) or the ``[agents]`` table (``{"kind": "a2a", "agents": {...}}``)."""
    from toolmesh.a2a.source import AgentSource

    if isinstance(entry.get("agents"), Mapping):
        agents = parse_agents_config(entry["agents"])
    else:
        settings = {**entry, **(entry.get("config") or {})}
        settings.pop("config", None)
        if not isinstance(settings.get("card"), str):
            raise ConfigError("an a2a entry needs a 'card' URL")
        name = str(settings.get("name") or "agent")
        agents = parse_agents_config({name: settings})
    return [AgentSource(a) for a in agents]
