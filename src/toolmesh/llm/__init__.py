"""Model-provider side: tool formats for OpenAI, Anthropic and Gemini."""

from toolmesh.llm.formats import to_anthropic, to_gemini, to_openai

__all__ = ["to_anthropic", "to_gemini", "to_openai"]
