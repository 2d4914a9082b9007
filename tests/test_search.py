"""Relevance search: natural-language queries find tools by name, description, tags, params."""

from __future__ import annotations

from toolmesh import ToolDefinition, ToolParameter
from toolmesh.search import SearchIndex, tokenize

CATALOGUE = [
    ToolDefinition(
        name="get_weather_forecast",
        description="Forecast for a city for the coming days",
        tags=["weather"],
    ),
    ToolDefinition(name="sendEmail", description="Send a message to an address", tags=["mail"]),
    ToolDefinition(name="fs.read_file", description="Read the contents of a file", tags=["fs"]),
    ToolDefinition(
        name="query",
        description="Run SQL",
        input_parameters=[
            ToolParameter(
                name="database_url", type="string", description="PostgreSQL connection string"
            )
        ],
    ),
    ToolDefinition(name="calculator", description="Evaluate arithmetic expressions", tags=["math"]),
]


def index() -> SearchIndex:
    built = SearchIndex()
    for d in CATALOGUE:
        built.add(d.name, d)
    return built


def top(query: str) -> str:
    return index().search(query, limit=1)[0][0]


def test_tokenize_splits_and_stems() -> None:
    assert tokenize("sendEmail") == ["send", "email"]
    assert tokenize("get_weather.forecasts") == ["weather", "forecast"]
    assert tokenize("HTTPServer-config") == ["http", "server", "config"]


def test_natural_language_queries() -> None:
    assert top("what will the weather be tomorrow") == "get_weather_forecast"
    assert top("email someone") == "sendEmail"
    assert top("read a file") == "fs.read_file"
    assert top("postgres connection") == "query"
    assert top("calc") == "calculator"  # prefix of an indexed word


def test_exact_name_wins() -> None:
    assert top("query") == "query"


def test_no_match_is_empty() -> None:
    assert index().search("zebra") == []


def test_remove_and_replace() -> None:
    built = index()
    built.remove("sendEmail")
    assert "sendEmail" not in built and all(k != "sendEmail" for k, _ in built.search("email"))
    built.add("x", ToolDefinition(name="x", description="email helper"))
    assert built.search("email")[0][0] == "x"
    assert len(built) == len(CATALOGUE)
