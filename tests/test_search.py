"""Relevance search: natural-language queries find tools by name, description, tags, params."""

from __future__ import annotations

import pytest

from toolmesh import ToolDefinition, ToolParameter
from toolmesh.errors import ConfigError
from toolmesh.search import Ranking, SearchIndex, create_index, split_words, tokenize

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
    assert tokenize("sendEmail") == ["send", "email", "sendemail"]
    assert tokenize("get_weather.forecasts") == ["weather", "forecast"]
    assert tokenize("HTTPServer-config") == ["http", "server", "config", "httpserver"]


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
    assert tokenize("HTTP2Server get2Items") == [
        *("http2", "server", "get2", "item"),
        *("http2server", "get2item"),  # the words camelCase split, joined
    ]
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
    assert tokenize("MünchenPlan sendEmail") == ["münchenplan", "send", "email", "sendemail"]


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


# -- parameters nested in arrays, text mixing scripts (QA: search and deferred loading) ----------


def _notify() -> ToolDefinition:
    from toolmesh.schema import schema_to_parameters

    schema = {
        "type": "object",
        "properties": {
            "recipients": {
                "type": "array",
                "description": "who is told",
                "items": {
                    "type": "object",
                    "properties": {
                        "mailbox": {"type": "string", "description": "an RFC 5322 address"}
                    },
                },
            },
            "labels": {"type": "array", "items": {"type": "string", "description": "a colour"}},
        },
    }
    return ToolDefinition(
        name="notify", description="Tell people", input_parameters=schema_to_parameters(schema)
    )


def test_parameters_of_array_elements_are_indexed() -> None:
    built = SearchIndex()
    built.add("notify", _notify())
    assert [key for key, _ in built.search("mailbox")] == ["notify"]  # an element's property
    assert [key for key, _ in built.search("rfc address")] == ["notify"]  # and its description
    assert [key for key, _ in built.search("colour")] == ["notify"]  # an element's description
    assert built.search("items") == []  # the element's name is the schema's, not the author's


async def test_regex_tool_search_reads_parameters_of_array_elements() -> None:
    from toolmesh import Tool, Toolkit

    async def run(arguments: dict[str, object], ctx: object) -> str:
        return "told"

    kit = Toolkit(Tool(_notify(), run), tool_search=True)  # type: ignore[arg-type]
    for pattern in ("mailbox", "rfc 5322", "colour"):
        result = await kit.execute("tool_search_regex", {"pattern": pattern})
        assert result.metadata["tool_references"] == ["notify"], pattern
    result = await kit.execute("tool_search_regex", {"pattern": "^items$"})
    assert result.metadata["tool_references"] == []


def test_latin_words_inside_unspaced_text_stay_words() -> None:
    # Chinese and Japanese write Latin names and numbers into their text with no space.
    assert tokenize("使用GitHub创建issue") == ["使用", "git", "hub", "创建", "issu", "github"]
    assert tokenize("東京の天気2024年") == ["東京", "京の", "の天", "天気", "2024", "年"]
    built = SearchIndex()
    built.add("gh", ToolDefinition(name="gh_new", description="使用GitHub创建issue"))
    built.add("other", ToolDefinition(name="other", description="创建文件"))
    assert [key for key, _ in built.search("issue")] == ["gh"]
    assert [key for key, _ in built.search("git hub")] == ["gh"]
    assert [key for key, _ in built.search("github")] == ["gh"]  # joined here too
    built.add("tokyo", ToolDefinition(name="tokyo", description="東京の天気2024年"))
    assert [key for key, _ in built.search("2024")] == ["tokyo"]  # not "気2", "20", "02", "24"


def _full_width(text: str) -> str:
    """``text`` as typed on a Japanese keyboard: U+FF01-FF5E for ASCII's ! to ~."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def test_full_width_letters_and_digits_are_the_ascii_ones() -> None:
    assert tokenize(_full_width("github V2")) == ["github", "v2"]
    built = index()
    assert built.search(_full_width("send email"), limit=1)[0][0] == "sendEmail"
    assert built.search(_full_width("calc"), limit=1)[0][0] == "calculator"


def test_one_character_of_an_unspaced_script_finds_the_pairs_it_starts() -> None:
    built = SearchIndex()
    built.add("rain", ToolDefinition(name="rain", description="查询明天的雨量"))
    built.add("sun", ToolDefinition(name="sun", description="日出时间 query"))
    assert [key for key, _ in built.search("雨")] == ["rain"]
    assert [key for key, _ in built.search("日")] == ["sun"]
    assert built.search("q") == []  # one Latin letter is still too short to expand


def test_filtered_search_agrees_with_the_full_ranking() -> None:
    built = SearchIndex()
    for i in range(40):
        built.add(f"t{i:02d}", ToolDefinition(name=f"t{i:02d}", description="send mail " * (i % 4)))
    ranked = [key for key, _ in built.search("mail")]
    odd = [key for key in ranked if int(key[1:]) % 2]
    for limit in (None, 1, 3, 19, 20, 100):
        found = built.search("mail", limit=limit, accept=lambda key: int(key[1:]) % 2 == 1)
        assert [key for key, _ in found] == odd[:limit]
    assert built.search("mail", limit=5, accept=lambda key: False) == []


def test_a_query_is_read_up_to_its_bound() -> None:
    """A peer's query of megabytes was tokenised whole (seconds, in the host's loop), and each
    distinct long word kept in the term cache."""
    from toolmesh.search import MAX_QUERY_CHARS

    built = SearchIndex()
    built.add("zebra", ToolDefinition(name="zebra", description="Finds zebras."))
    assert [key for key, _ in built.search("zebra " + "x" * MAX_QUERY_CHARS)] == ["zebra"]
    assert built.search("x" * MAX_QUERY_CHARS + " zebra") == []  # past the bound: not read


# -- names written in camelCase, typed as one word ("github" for "GitHub") ------------------------

BRANDS = [
    ToolDefinition(name="createGitHubIssue", description="Open an issue in a repository"),
    ToolDefinition(name="upload_video", description="Upload a video to YouTube"),
    ToolDefinition(name="askOpenAI", description="Ask a language model a question"),
    ToolDefinition(name="backup_device", description="Back up an iPhone"),
    # Tools describing themselves with the words those names split into.
    ToolDefinition(name="show_history", description="Show the git history of a hub"),
    ToolDefinition(name="london_map", description="Map of the London tube"),
    ToolDefinition(name="read_file", description="Open a file"),
    ToolDefinition(name="dial", description="Call a phone number"),
]


def index_of(definitions: list[ToolDefinition]) -> SearchIndex:
    built = SearchIndex()
    for d in definitions:
        built.add(d.name, d)
    return built


def brands() -> SearchIndex:
    return index_of(BRANDS)


def test_tokenize_also_joins_the_words_camel_case_splits() -> None:
    assert tokenize("GitHub") == ["git", "hub", "github"]
    assert tokenize("github") == ["github"]
    assert tokenize("OpenAI") == ["open", "ai", "openai"]
    assert tokenize("iPhone") == ["phone", "iphon"]  # "i" is a stop word
    # Each two and three neighbours, and the whole run: a name inside a longer identifier is
    # found too.
    assert tokenize("createGitHubIssue") == [
        *("creat", "git", "hub", "issu"),
        *("creategit", "github", "hubissu", "creategithub", "githubissu", "creategithubissu"),
    ]
    assert "duckduckgo" in tokenize("searchDuckDuckGo")  # a brand of three words inside four
    assert split_words("createGitHubIssue") == ["create", "git", "hub", "issue"]  # words only


def test_an_acronym_s_plural_stays_one_word() -> None:
    # "URLs" was cut into "ur" "ls", so "list urls" missed listURLs and found "ls" tools.
    assert split_words("listURLs") == ["list", "urls"]
    assert tokenize("listURLs") == ["list", "url", "listurl"]
    assert split_words("fetchAPIsNow") == ["fetch", "apis", "now"]
    assert split_words("HTTPServer") == ["http", "server"]  # a capital after: another word
    assert split_words("USAsia") == ["us", "asia"]


def test_lower_case_queries_find_names_written_in_camel_case() -> None:
    built = brands()
    assert [key for key, _ in built.search("github")] == ["createGitHubIssue"]  # in a name
    assert [key for key, _ in built.search("openai")] == ["askOpenAI"]
    assert [key for key, _ in built.search("youtube")] == ["upload_video"]  # in a description
    assert [key for key, _ in built.search("iphone")] == ["backup_device"]
    assert [key for key, _ in built.search("github issue", limit=1)] == ["createGitHubIssue"]


def test_a_brand_of_three_words_inside_a_longer_name_is_found() -> None:
    built = index_of([*BRANDS, ToolDefinition(name="searchDuckDuckGo", description="Web search")])
    assert [key for key, _ in built.search("duckduckgo")] == ["searchDuckDuckGo"]


def test_camel_case_queries_still_find_them() -> None:
    built = brands()
    for query, expected in [
        ("GitHub", "createGitHubIssue"),
        ("createGitHubIssue", "createGitHubIssue"),
        ("YouTube", "upload_video"),
        ("OpenAI", "askOpenAI"),
        ("iPhone", "backup_device"),
        ("git hub", "createGitHubIssue"),
    ]:
        assert built.search(query, limit=1)[0][0] == expected, query


def test_a_name_whose_first_word_is_a_stop_word_is_found() -> None:
    # "you" is a stop word: "YouTube" was left with "tube", and "youtube" found nothing.
    built = SearchIndex()
    built.add("yt", ToolDefinition(name="YouTubeSearch", description="Find videos"))
    built.add("tube", ToolDefinition(name="tube_status", description="Lines of the tube"))
    assert [key for key, _ in built.search("youtube")] == ["yt"]
    assert [key for key, _ in built.search("youtube search")] == ["yt"]
    assert built.search("you") == []
    assert tokenize("YouTube") == ["tube", "youtub"]


IDENTIFIERS = [
    ToolDefinition(name="sendEmail", description="Send a message to an address"),
    ToolDefinition(name="send_sms", description="Send a text message to a phone"),
    ToolDefinition(name="createIssue", description="Open an issue in a repository"),
    ToolDefinition(name="create_repo", description="Create a repository"),
    ToolDefinition(name="HTTPServer", description="Serve files over HTTP"),
    ToolDefinition(name="http_get", description="Fetch a URL"),
    ToolDefinition(name="get_user_by_id", description="Look up one user"),
    ToolDefinition(name="list_users", description="Every user of the service"),
]


def test_identifiers_split_on_camel_case_rank_as_before() -> None:
    built = index_of(IDENTIFIERS)
    ranked = {
        query: [key for key, _ in built.search(query)]
        for query in ("send email", "create issue", "http server", "user id")
    }
    assert ranked == {
        "send email": ["sendEmail", "send_sms"],
        "create issue": ["createIssue", "create_repo"],
        "http server": ["HTTPServer", "http_get"],
        "user id": ["get_user_by_id", "list_users"],
    }


def test_joined_words_do_not_lengthen_a_field() -> None:
    # "sendemail" is another spelling of "send email", not a third word: BM25's length
    # normalisation would otherwise rank camelCase names below the same names in snake_case.
    built = SearchIndex()
    for name in ("sendEmail", "send_email"):
        built.add(name, ToolDefinition(name=name, description="Send a message"))
    scores = dict(built.search("send email"))
    assert scores["sendEmail"] == scores["send_email"]


def test_a_prefix_completes_words_not_joined_ones() -> None:
    built = SearchIndex()
    built.add("camel", ToolDefinition(name="RentalCars", description="Cars to hire"))
    built.add("snake", ToolDefinition(name="rental_cars", description="Cars to hire"))
    scores = dict(built.search("rent"))  # "rental" only: "rentalcar" would count camel twice
    assert scores["camel"] == scores["snake"]
    assert [key for key, _ in built.search("rentalcar")] == ["camel"]  # a whole word, not a prefix
    assert built.search("rentalc") == []
    built.add("word", ToolDefinition(name="hire", description="rentalcar"))  # now also a word
    assert sorted(key for key, _ in built.search("rentalc")) == ["camel", "word"]
    built.remove("word")
    assert built.search("rentalc") == []


async def test_a_toolkit_search_finds_a_name_written_in_camel_case() -> None:
    from toolmesh import Tool, Toolkit

    async def run(arguments: dict[str, object], ctx: object) -> str:
        return "done"

    kit = Toolkit(*(Tool(d, run) for d in BRANDS))  # type: ignore[arg-type]
    assert [tool.name for tool in kit.search("github", limit=1)] == ["createGitHubIssue"]
