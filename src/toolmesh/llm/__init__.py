"""Model-provider side: tool formats for OpenAI, Anthropic and Gemini, and their calls read back."""

from toolmesh.llm.calls import ToolCall, parse_tool_call, parse_tool_calls
from toolmesh.llm.formats import to_anthropic, to_gemini, to_openai
from toolmesh.llm.schemas import gemini_schema, openai_strict_schema

__all__ = [
    "ToolCall",
    "gemini_schema",
    "openai_strict_schema",
    "parse_tool_call",
    "parse_tool_calls",
    "to_anthropic",
    "to_gemini",
    "to_openai",
]
