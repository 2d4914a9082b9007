"""Relevance search over tool definitions (BM25F).

Each tool is indexed by field: its name (split on ``_ . -`` and camelCase), tags, parameter
names, description and parameter descriptions. Each field has its own weight and its own length
normalisation (``Ranking``), and a term's frequencies in all fields are combined before BM25's
saturation, so a word repeated across fields does not count many times over (BM25F). Words are
lower-cased, stop words dropped and stems taken (Snowball English), so "weather forecasts" finds
``get_weather_forecast``. In a short query, a word that matches nothing is tried as a prefix of
indexed words ("calc" -> "calculator"). Adding or removing a tool updates the index in place;
each term's scores are computed once and kept until the index next changes.

The defaults of ``Ranking`` were tuned on the dev half of bench/retrieval (see docs/search.md).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from toolmesh.models import ToolDefinition, ToolParameter

__all__ = [
    "FIELDS",
    "Ranking",
    "SearchIndex",
    "SearchMode",
    "create_index",
    "split_words",
    "tokenize",
]

SearchMode = Literal["lexical", "hybrid"]
FIELDS = ("name", "tags", "params", "description", "param_descriptions")

_STOP_WORDS_TEXT = """
    a about am an and any are as at be been being but by can could do does for from get has have
    he her him his how i if im in into is it its just know let like me my need no not of on or our
    please should show so some sure tell than that the their them then there they this to too us
    use using very want was we what when where which who will with would you your
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NON_WORD = re.compile(r"[^0-9A-Za-z]+")


@dataclass(frozen=True, slots=True)
class Ranking:
    """BM25F settings. ``weights`` and ``b`` hold one value per field of ``FIELDS``."""

    weights: tuple[float, ...] = (4.0, 1.0, 0.3, 0.6, 0.3)
    b: tuple[float, ...] = (0.9, 0.3, 0.9, 0.5, 0.0)
    k1: float = 1.6
    prefix_weight: float = 0.75  # a prefix expansion counts this much of a whole word
    prefix_max_words: int = 1000  # only queries this short expand prefixes
    name_bonus: float = 5.0  # the query is exactly a tool's name

    def __post_init__(self) -> None:
        if len(self.weights) != len(FIELDS) or len(self.b) != len(FIELDS):
            raise ValueError(f"Ranking needs one weight and one b per field {FIELDS}")


@functools.lru_cache(maxsize=1)
def _stemmer() -> Any:
    import snowballstemmer  # on first use: it costs 10+ ms to import

    return snowballstemmer.stemmer("english")


@functools.lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return str(_stemmer().stemWord(word))


def split_words(text: str) -> list[str]:
    """Words of ``text`` split on punctuation and camelCase, lower-cased (no stems)."""
    return [word.lower() for word in _NON_WORD.split(_CAMEL.sub(" ", text)) if word]


def tokenize(text: str) -> list[str]:
    """Words of ``text``: split on punctuation and camelCase, lower-cased, stemmed, without
    stop words."""
    out = []
    for word in _NON_WORD.split(_CAMEL.sub(" ", text)):
        lowered = word.lower()
        if lowered and lowered not in STOP_WORDS:
            # Numbers have no stem, and there are too many distinct ones to cache.
            out.append(lowered if lowered.isdigit() else _stem(lowered))
    return out


@dataclass(slots=True)
class _Doc:
    terms: dict[str, tuple[int, ...]]  # term -> frequency in each field
    lengths: tuple[int, ...]
    name: str


class SearchIndex:
    """An incremental BM25F index from keys to tool definitions."""

    def __init__(self, ranking: Ranking | None = None) -> None:
        self.ranking = ranking or Ranking()
        self._docs: dict[str, _Doc] = {}
        self._postings: dict[str, set[str]] = {}
        self._length_sums = [0] * len(FIELDS)
        self._vocabulary: list[str] | None = None
        self._by_name: dict[str, set[str]] = {}
        self._term_scores: dict[str, dict[str, float]] = {}  # valid until the next change

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, key: object) -> bool:
        return key in self._docs

    def add(self, key: str, definition: ToolDefinition) -> None:
        """Index ``definition`` under ``key`` (replacing what was there)."""
        if key in self._docs:
            self.remove(key)
        fields = _fields(definition)
        counts: dict[str, list[int]] = {}
        for index, words in enumerate(fields):
            for word in words:
                freqs = counts.get(word)
                if freqs is None:
                    freqs = counts[word] = [0] * len(FIELDS)
                freqs[index] += 1
        doc = _Doc(
            terms={term: tuple(freqs) for term, freqs in counts.items()},
            lengths=tuple(len(words) for words in fields),
            name=definition.name.lower(),
        )
        self._docs[key] = doc
        self._by_name.setdefault(doc.name, set()).add(key)
        for term in doc.terms:
            postings = self._postings.get(term)
            if postings is None:
                self._postings[term] = {key}
                self._vocabulary = None
            else:
                postings.add(key)
        for index, length in enumerate(doc.lengths):
            self._length_sums[index] += length
        if self._term_scores:
            self._term_scores = {}

    def remove(self, key: str) -> None:
        doc = self._docs.pop(key, None)
        if doc is None:
            return
        same_name = self._by_name[doc.name]
        same_name.discard(key)
        if not same_name:
            del self._by_name[doc.name]
        for term in doc.terms:
            postings = self._postings[term]
            postings.discard(key)
            if not postings:
                del self._postings[term]
                self._vocabulary = None
        for index, length in enumerate(doc.lengths):
            self._length_sums[index] -= length
        if self._term_scores:
            self._term_scores = {}

    def scores(self, query: str) -> dict[str, float]:
        """Every matching key with its score for ``query`` (unordered)."""
        scores: dict[str, float] = {}
        if not self._docs:
            return scores
        for term, weight in self._query_terms(tokenize(query)).items():
            contributions = self._term_scores.get(term)
            if contributions is None:
                contributions = self._term_scores[term] = self._score_term(term)
            if not scores:
                scores = {key: weight * value for key, value in contributions.items()}
                continue
            get = scores.get
            for key, value in contributions.items():
                scores[key] = get(key, 0.0) + weight * value
        wanted = query.strip().lower()
        for key in self._by_name.get(wanted, ()) if wanted else ():
            scores[key] = scores.get(key, 0.0) + self.ranking.name_bonus
        return scores

    def search(
        self,
        query: str,
        *,
        limit: int | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> list[tuple[str, float]]:
        """Keys ranked by relevance to ``query``, best first (only those ``accept`` admits)."""
        scores = self.scores(query)
        if limit is not None:
            best = heapq.nsmallest(limit, scores.items(), key=_best_first)
            if accept is None:
                return best
            kept = [item for item in best if accept(item[0])]
            if len(kept) == len(best):
                return kept
        ranked = sorted(scores.items(), key=_best_first)
        if accept is not None:
            ranked = [item for item in ranked if accept(item[0])]
        return ranked[:limit] if limit is not None else ranked

    def ranked(self, query: str) -> Iterator[str]:
        """Keys best first, computed lazily: a caller filtering them stops when it has enough."""
        scores = self.scores(query)
        if len(scores) > 64:
            head = heapq.nsmallest(32, scores.items(), key=_best_first)
            yield from (key for key, _ in head)
            seen = {key for key, _ in head}
            rest = [item for item in scores.items() if item[0] not in seen]
            yield from (key for key, _ in sorted(rest, key=_best_first))
        else:
            yield from (key for key, _ in sorted(scores.items(), key=_best_first))

    def _score_term(self, term: str) -> dict[str, float]:
        """idf x saturated pseudo-frequency of ``term`` for every document holding it."""
        ranking = self.ranking
        postings = self._postings[term]
        total = len(self._docs)
        idf = math.log(1.0 + (total - len(postings) + 0.5) / (len(postings) + 0.5))
        averages = [max(s / total, 1e-9) for s in self._length_sums]
        fields = tuple(zip(ranking.weights, ranking.b, averages, strict=True))
        k1 = ranking.k1
        out: dict[str, float] = {}
        for key in postings:
            doc = self._docs[key]
            pseudo = 0.0
            for freq, length, (weight, b, average) in zip(
                doc.terms[term], doc.lengths, fields, strict=True
            ):
                if freq:
                    pseudo += weight * freq / (1.0 - b + b * length / average)
            out[key] = idf * pseudo / (k1 + pseudo)
        return out

    def _query_terms(self, words: list[str]) -> dict[str, float]:
        """Query words present in the index, plus prefix expansions of the missing ones (in
        short queries only: in a sentence, an unknown word is more often noise than a prefix)."""
        weights: dict[str, float] = {}
        expand = len(words) <= self.ranking.prefix_max_words
        for word in words:
            if word in self._postings:
                weights[word] = max(weights.get(word, 0.0), 1.0)
            elif expand and len(word) >= 3:
                for term in self._with_prefix(word):
                    weights[term] = max(weights.get(term, 0.0), self.ranking.prefix_weight)
        return weights

    def _with_prefix(self, prefix: str, limit: int = 20) -> list[str]:
        if self._vocabulary is None:
            self._vocabulary = sorted(self._postings)
        start = bisect.bisect_left(self._vocabulary, prefix)
        out = []
        for term in self._vocabulary[start : start + limit]:
            if not term.startswith(prefix):
                break
            out.append(term)
        return out


def create_index(mode: SearchMode | str | SearchIndex = "lexical") -> SearchIndex:
    """An index for ``mode``: "lexical" (BM25F, this module) or "hybrid" (BM25F fused with
    sentence embeddings: toolmesh.semantic, imported only here)."""
    if isinstance(mode, SearchIndex):
        return mode
    if mode == "lexical":
        return SearchIndex()
    if mode == "hybrid":
        from toolmesh.semantic import HybridIndex

        return HybridIndex()
    from toolmesh.errors import ConfigError

    raise ConfigError(f"search must be 'lexical' or 'hybrid', not {mode!r}")


def _best_first(item: tuple[str, float]) -> tuple[float, str]:
    return -item[1], item[0]


def _fields(definition: ToolDefinition) -> list[list[str]]:
    params: list[str] = []
    param_descriptions: list[str] = []
    for parameter in _walk(definition.input_parameters):
        params.extend(tokenize(parameter.name))
        if parameter.description:
            param_descriptions.extend(tokenize(parameter.description))
    return [
        tokenize(definition.name),
        [w for tag in definition.tags for w in tokenize(tag)],
        params,
        tokenize(definition.description),
        param_descriptions,
    ]


def _walk(parameters: Iterable[ToolParameter]) -> Iterable[ToolParameter]:
    for parameter in parameters:
        yield parameter
        if parameter.properties:
            yield from _walk(parameter.properties.values())
