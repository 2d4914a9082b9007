"""Relevance search over tool definitions (BM25F).

Each tool is indexed by field: its name (split on ``_ . -`` and camelCase), tags, parameter
names, description and parameter descriptions, each with its own weight. Words are lower-cased,
stop words dropped and stems taken (Snowball English), so "weather forecasts" finds
``get_weather_forecast``. A query word that matches nothing is tried as a prefix of indexed words
("calc" -> "calculator"). Adding or removing a tool updates the index in place.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from toolmesh.models import ToolDefinition, ToolParameter

__all__ = ["FIELD_WEIGHTS", "SearchIndex", "tokenize"]

FIELDS = ("name", "tags", "params", "description", "param_descriptions")
FIELD_WEIGHTS = (3.0, 2.0, 1.5, 1.0, 0.6)
FIELD_B = (0.3, 0.3, 0.5, 0.75, 0.75)  # short fields are hardly length-normalised
K1 = 1.2
PREFIX_WEIGHT = 0.5
NAME_MATCH_BONUS = 5.0

STOP_WORDS = frozenset(
    (
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "get",
        "has",
        "have",
        "how",
        "i",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "please",
        "should",
        "show",
        "that",
        "the",
        "their",
        "them",
        "then",
        "this",
        "to",
        "use",
        "using",
        "was",
        "what",
        "when",
        "where",
        "which",
        "who",
        "will",
        "with",
        "would",
        "you",
        "your",
    )
)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NON_WORD = re.compile(r"[^0-9A-Za-z]+")


@functools.lru_cache(maxsize=1)
def _stemmer() -> Any:
    import snowballstemmer  # on first use: it costs 10+ ms to import

    return snowballstemmer.stemmer("english")


@functools.lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return str(_stemmer().stemWord(word))


def tokenize(text: str) -> list[str]:
    """Words of ``text``: split on punctuation and camelCase, lower-cased, stemmed, without
    stop words."""
    words = _NON_WORD.split(_CAMEL.sub(" ", text))
    out = []
    for word in words:
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

    def __init__(self) -> None:
        self._docs: dict[str, _Doc] = {}
        self._postings: dict[str, set[str]] = {}
        self._length_sums = [0] * len(FIELDS)
        self._vocabulary: list[str] | None = None
        self._by_name: dict[str, set[str]] = {}

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
                counts.setdefault(word, [0] * len(FIELDS))[index] += 1
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

    def search(
        self,
        query: str,
        *,
        limit: int | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> list[tuple[str, float]]:
        """Keys ranked by relevance to ``query``, best first (only those ``accept`` admits)."""
        if not self._docs:
            return []
        weights = self._query_terms(tokenize(query))
        scores: dict[str, float] = {}
        total = len(self._docs)
        averages = [max(s / total, 1e-9) for s in self._length_sums]
        for term, weight in weights.items():
            postings = self._postings[term]
            idf = math.log(1.0 + (total - len(postings) + 0.5) / (len(postings) + 0.5))
            for key in postings:
                if accept is not None and not accept(key):
                    continue
                doc = self._docs[key]
                freqs = doc.terms[term]
                pseudo = 0.0
                for i, freq in enumerate(freqs):
                    if freq:
                        norm = 1.0 - FIELD_B[i] + FIELD_B[i] * doc.lengths[i] / averages[i]
                        pseudo += FIELD_WEIGHTS[i] * freq / norm
                scores[key] = scores.get(key, 0.0) + weight * idf * pseudo / (K1 + pseudo)
        self._bonus_exact_names(query, scores, accept)
        return heapq.nsmallest(limit or len(scores), scores.items(), key=_best_first)

    def _query_terms(self, words: Iterable[str]) -> dict[str, float]:
        """Query words present in the index, plus prefix expansions of the missing ones."""
        weights: dict[str, float] = {}
        for word in words:
            if word in self._postings:
                weights[word] = max(weights.get(word, 0.0), 1.0)
            elif len(word) >= 3:
                for term in self._with_prefix(word):
                    weights[term] = max(weights.get(term, 0.0), PREFIX_WEIGHT)
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

    def _bonus_exact_names(
        self, query: str, scores: dict[str, float], accept: Callable[[str], bool] | None
    ) -> None:
        wanted = query.strip().lower()
        if not wanted:
            return
        for key in self._by_name.get(wanted, ()):
            if accept is None or accept(key):
                scores[key] = scores.get(key, 0.0) + NAME_MATCH_BONUS


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
