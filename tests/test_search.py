"""Relevance search: natural-language queries find tools by name, description, tags, params."""

from __future__ import annotations

import pytest

from toolmesh import ToolDefinition, ToolParameter
from toolmesh.errors import ConfigError
from toolmesh.search import Ranking, SearchIndex, create_index, tokenize

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


def test_tokenize_keeps_letters_and_digits_together() -> None:
    assert tokenize("HTTP2Server get2Items") == ["http2", "server", "get2", "item"]
    assert tokenize("the 2024 report") == ["2024", "report"]


def test_ties_are_broken_by_key_and_limit_cuts() -> None:
    built = SearchIndex()
    for key in ("c", "a", "b"):
        built.add(key, ToolDefinition(name=f"tool_{key}", description="send mail"))
    assert [k for k, _ in built.search("mail")] == ["a", "b", "c"]
    assert [k for k, _ in built.search("mail", limit=2)] == ["a", "b"]
    assert built.search("mail", limit=0) == []


def test_accept_filters_beyond_the_first_page() -> None:
    built = SearchIndex()
    for i in range(30):
        built.add(f"t{i:02d}", ToolDefinition(name=f"t{i:02d}", description="send mail"))
    found = built.search("mail", limit=3, accept=lambda key: key >= "t25")
    assert [k for k, _ in found] == ["t25", "t26", "t27"]


def test_scores_follow_changes_to_the_index() -> None:
    built = index()
    before = dict(built.search("email"))
    built.add("mailer", ToolDefinition(name="mailer", description="email email email"))
    after = dict(built.search("email"))
    assert "mailer" in after
    assert after["sendEmail"] != before["sendEmail"]  # idf and averages moved: no stale cache
    built.remove("mailer")
    assert dict(built.search("email")) == before


def test_ranking_settings() -> None:
    with pytest.raises(ValueError, match="one weight and one b per field"):
        SearchIndex(Ranking(weights=(1.0,)))
    names_only = SearchIndex(Ranking(weights=(1.0, 0.0, 0.0, 0.0, 0.0)))
    for d in CATALOGUE:
        names_only.add(d.name, d)
    assert names_only.search("arithmetic") == []  # description words do not count
    assert names_only.search("calculator")[0][0] == "calculator"


def test_create_index() -> None:
    assert type(create_index()) is SearchIndex
    custom = SearchIndex()
    assert create_index(custom) is custom
    with pytest.raises(ConfigError, match="'lexical' or 'hybrid'"):
        create_index("fuzzy")


def test_words_in_any_script_are_found() -> None:
    built = index()
    built.add("pogoda", ToolDefinition(name="pogoda", description="Прогноз погоды для города"))
    built.add("tianqi", ToolDefinition(name="tianqi", description="查询城市天气预报"))
    built.add("karte", ToolDefinition(name="karte", description="Stadtplan von München"))
    assert built.search("погоды", limit=1)[0][0] == "pogoda"
    assert built.search("天气", limit=1)[0][0] == "tianqi"
    assert built.search("münchen", limit=1)[0][0] == "karte"
    assert built.search("für", limit=5) == []  # no longer matched letter by letter
    assert tokenize("MünchenPlan sendEmail") == ["münchenplan", "send", "email"]


def test_words_keep_their_combining_marks() -> None:
    # Devanagari vowel signs are marks, not letters: "मौसम" is one word, not "म" + "सम".
    assert tokenize("मौसम का पूर्वानुमान") == ["मौसम", "का", "पूर्वानुमान"]
    index = SearchIndex()
    index.add("hindi", ToolDefinition(name="forecast_hi", description="मौसम का पूर्वानुमान"))
    index.add("cafe", ToolDefinition(name="find_place", description="find a café nearby"))
    index.add("thai", ToolDefinition(name="forecast_th", description="พยากรณ์อากาศ"))
    assert index.search("अनुमान") == []  # another word, sharing only letters
    assert [key for key, _ in index.search("पूर्वानुमान")] == ["hindi"]
    assert [key for key, _ in index.search("cafe\u0301")] == ["cafe"]  # "café" typed decomposed
    assert [key for key, _ in index.search("อากาศ")] == ["thai"]  # Thai has no spaces
