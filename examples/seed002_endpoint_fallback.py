import asyncio

from toolmesh.a2a import Agent, agent_tools


async def main():
    # A card with two skills and no explicit `url` — served straight from an
    # in-process fake fetch by monkeypatching the module's card fetcher would be
    # overkill here; instead build the same shape agent_tools consumes by hand to
    # show the endpoint-fallback rule without a real HTTP round trip.
    import toolmesh.a2a as a2a_mod

    async def fake_fetch_card(card_url, headers, timeout_s):
        return {
            "name": "multi-skill-desk",
            # no "url" key — agent_tools must fall back to the card URL's origin.
            "skills": [
                {"id": "summarize", "description": "Summarize a document."},
                {"id": "translate", "description": "Translate text."},
            ],
        }

    original = a2a_mod._fetch_card
    a2a_mod._fetch_card = fake_fetch_card
    try:
        tools = await agent_tools(Agent(card="http://127.0.0.1:8080/.well-known/agent-card.json"))
    finally:
        a2a_mod._fetch_card = original

    assert [t.name for t in tools] == ["multi-skill-desk_summarize", "multi-skill-desk_translate"]
    assert [t.description for t in tools] == ["Summarize a document.", "Translate text."]
    # Every skill of one card shares the SAME endpoint (the origin fallback).
    assert all(t.name.startswith("multi-skill-desk_") for t in tools)

    print("ok:", [t.name for t in tools])


asyncio.run(main())
