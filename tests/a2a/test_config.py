"""Agents declared in configuration: precedence rules, settings, the manifest hook."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from toolmesh import ConfigError, parse_agents_config
from toolmesh.a2a import AgentSource
from toolmesh.a2a.config import sources_from_manifest

CARD = "https://agents.example/.well-known/agent-card.json"


def test_precedence_rules() -> None:
    agents = parse_agents_config(
        {
            "agents": {
                "plain": {"card": CARD},
                "not_a_table": "https://x.example",
                "off_without_card": {"enabled": False},
                "off": {"card": CARD, "enabled": False},
                "disabled_wins": {"card": CARD, "enabled": True, "disabled": True},
                "on": {"card": CARD, "enabled": True, "disabled": False},
            }
        }
    )
    assert [a.name for a in agents] == ["plain", "on"]


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"url": CARD}, "needs 'card', the URL of the agent's card, as text; did you mean 'card'?"),
        ({"headers": {}}, "needs 'card'"),
        ({"card": 42}, "needs 'card'"),
    ],
)
def test_an_agent_table_without_a_card_is_an_error(entry: dict[str, Any], says: str) -> None:
    # It used to be skipped: a typo ('url' for 'card') dropped the agent without a word.
    with pytest.raises(ConfigError, match=re.escape(says)) as caught:
        parse_agents_config({"agents": {"typo": entry}})
    assert "agents.typo" in str(caught.value)


def test_an_agent_keyed_card_is_read_with_the_others() -> None:
    agents = parse_agents_config({"agents": {"card": {"card": CARD}, "research": {"card": CARD}}})
    assert [a.name for a in agents] == ["card", "research"]
    [inline] = parse_agents_config({"agents": {"card": CARD}})  # one agent keyed "agents"
    assert inline.name == "agents"


def test_a_bare_table_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TOKEN", "t0k")
    [agent] = parse_agents_config(
        {
            "research": {
                "card": CARD,
                "headers": {"Authorization": "Bearer ${AGENT_TOKEN}"},
                "timeout": 12,
                "pollEvery": 0.5,
            }
        }
    )
    assert agent.headers == {"Authorization": "Bearer t0k"}
    assert (agent.timeout, agent.poll_every, agent.card) == (12.0, 0.5, CARD)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"card": CARD, "timeout": -1}, "agents.x: 'timeout' must be a positive"),
        ({"card": CARD, "poll_every": "soon"}, "agents.x: 'poll_every' must be a positive"),
        ({"card": CARD, "headers": ["a"]}, "agents.x: 'headers' must be a table"),
        ({"card": CARD, "headers": {"A": "${NOT_SET_ANYWHERE}"}}, "NOT_SET_ANYWHERE is not set"),
        ({"card": "ftp://x"}, "agents.x: an agent card must be an http"),
    ],
)
def test_bad_entries_name_their_place(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_agents_config({"x": entry})


def test_manifest_hook(tmp_path: Path) -> None:
    table = sources_from_manifest(
        {"kind": "a2a", "agents": {"a": {"card": CARD}, "b": {"card": CARD, "enabled": False}}},
        base_dir=tmp_path,
    )
    assert [s.name for s in table] == ["a2a:a"]
    entry = sources_from_manifest(
        {"kind": "a2a", "name": "r", "config": {"card": CARD, "timeout": 5}}, base_dir=tmp_path
    )
    assert isinstance(entry[0], AgentSource) and entry[0].agent.timeout == 5.0
    with pytest.raises(ConfigError, match="needs a 'card'"):
        sources_from_manifest({"kind": "a2a"}, base_dir=tmp_path)


@pytest.mark.network_server
async def test_agents_in_the_manifest(tmp_path: Path) -> None:
    from tests.conftest import REPO
    from tests.fixtures.llm_stub import StubLLM, openai_text
    from toolmesh import create_client, create_toolkit

    with StubLLM(lambda body, i: openai_text("hi")) as llm:
        served = await create_toolkit(skills_dir=REPO / "examples" / "skills")
        handle = await served.serve(client=create_client(llm.base_url, model="m"), a2a="desk")
        try:
            manifest = tmp_path / "toolmesh.toml"
            manifest.write_text(
                f'[[tools]]\nkind = "a2a"\ncard = "{handle.url}"\nprefix = "again"\n\n'
                f'[agents.desk]\ncard = "{handle.url}/.well-known/agent-card.json"\n'
                '[agents.off]\ncard = "http://127.0.0.1:9/"\nenabled = false\n'
            )
            async with await create_toolkit(config=manifest) as kit:
                assert kit.names() == ["again_desk_hello-world", "desk_hello-world"]
                result = await kit.execute("desk_hello-world", {"task": "hello"})
        finally:
            await handle.stop()
            await served.close()
    assert result.output == "hi"


def test_agents_that_is_not_a_table_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^agents: must be a table of agents, not 5$"):
        parse_agents_config({"agents": 5})
