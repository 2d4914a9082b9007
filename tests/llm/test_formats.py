"""Provider tool formats (the basic shapes; strict modes are tested with the provider SDKs)."""

from __future__ import annotations

from toolmesh import Toolkit, tool
from toolmesh.llm import to_anthropic, to_gemini, to_openai


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_shapes() -> None:
    kit = Toolkit(add)
    schema = add.input_schema
    assert to_openai(kit) == [
        {
            "type": "function",
            "function": {"name": "add", "description": "Add two integers.", "parameters": schema},
        }
    ]
    assert to_openai([add], api="responses")[0]["name"] == "add"
    assert to_anthropic(kit) == [
        {"name": "add", "description": "Add two integers.", "input_schema": schema}
    ]
    assert to_gemini([add.definition])[0]["function_declarations"][0]["name"] == "add"
    assert kit.to_anthropic() == to_anthropic(kit)
