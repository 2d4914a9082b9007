"""Model-provider side: tool formats for OpenAI, Anthropic and Gemini, their calls read back, and
a client for their APIs that runs an agent loop over a toolkit
(``create_client(...).run(prompt, toolkit=...)``)."""

from toolmesh.llm.calls import ToolCall, parse_tool_call, parse_tool_calls
from toolmesh.llm.client import LLMClient, create_client
from toolmesh.llm.formats import to_anthropic, to_gemini, to_openai
from toolmesh.llm.loop import RunEvent, RunResult
from toolmesh.llm.schemas import gemini_schema, openai_strict_schema
from toolmesh.llm.styles import ChatMessage, ModelCall, Usage

__all__ = [
    "ChatMessage",
    "LLMClient",
    "ModelCall",
    "RunEvent",
    "RunResult",
    "ToolCall",
    "Usage",
    "create_client",
    "gemini_schema",
    "openai_strict_schema",
    "parse_tool_call",
    "parse_tool_calls",
    "to_anthropic",
    "to_gemini",
    "to_openai",
]
