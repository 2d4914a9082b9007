"""Relevance search over tool definitions (BM25F).

Each tool is indexed by field: its name (split on ``_ . -`` and camelCase), tags, parameter
names, description and parameter descriptions. Each field has its own weight and its own length
normalisation (``Ranking``), and a term's frequencies in all fields are combined before BM25's
saturation, so a word repeated across fields does not count many times over (BM25F). Words are
lower-cased, stop words dropped and stems taken (Snowball English), so "weather forecasts" finds
``get_weather_forecast``. The words camelCase splits are also indexed joined (each two and
three neighbours, and the whole run), as such names are typed: "github" finds "GitHub" and
``createGitHubIssue``, "duckduckgo" ``searchDuckDuckGo``. A query word that matches nothing
is tried as a prefix of indexed words ("calc" -> "calculator"). Adding or removing a tool
updates the index in place; each term's scores are computed once and kept until the index next
changes.

The defaults of ``Ranking`` were tuned on the dev half of bench/retrieval (see docs/search.md).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from toolmesh.models import ToolDefinition, ToolParameter

__all__ = [
    "FIELDS",
    "MAX_QUERY_CHARS",
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

# A run of ASCII letters and digits ("sendEmail"), and its words: broken where camelCase starts a
# new word ("send" "Email", "HTTP" "Server"), an acronym's plural kept whole ("get" "URLs").
_RUN = re.compile(r"[A-Za-z0-9]+")
_WORD = re.compile(r"[A-Z]{2,}s(?![a-z])|[A-Z]+(?=[A-Z][a-z])|[A-Z]*[a-z0-9]+|[A-Z0-9]+")
# Text beyond ASCII: runs of letters and digits in any script ("München", "погоды"), with their
# combining marks (the vowel signs of "मौसम"), camelCase split inside the ASCII runs only; a run
# in a script written without spaces (Chinese, Japanese, Korean, Thai, Lao, Myanmar, Khmer) gives
# its overlapping character pairs, so "天气" finds "查询城市天气预报", and the words of other
# scripts written into it with no space ("使用GitHub创建issue") stay words of their own.
_UNSPACED_CLASS = (
    r"\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff"
    r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
)
_UNSPACED = re.compile(f"[{_UNSPACED_CLASS}]")
_SCRIPT_PARTS = re.compile(f"[{_UNSPACED_CLASS}]+|[^{_UNSPACED_CLASS}]+")
_TERMS_LIMIT = 200_000  # runs remembered with their terms; forgotten all at once past this
_JOINED_WORDS = 3  # camelCase words joined up to this many at a time (and the whole run)
_REMEMBERED_RUN_CHARS = 64  # longer runs are stemmed each time, not kept (a peer's junk)
MAX_QUERY_CHARS = 4096
"""What of a query is read (the rest is ignored): queries come from peers, in messages of up to
16 MiB, and a model's search is a few words."""


class Ranking(NamedTuple):
    """BM25F settings. ``weights`` and ``b`` hold one value per field of ``FIELDS``.
    (A NamedTuple rather than a dataclass: it costs the import a fifth as much.)"""

    weights: tuple[float, ...] = (3.0, 1.0, 0.3, 0.3, 0.3)
    b: tuple[float, ...] = (0.9, 0.3, 0.75, 0.5, 0.0)
    k1: float = 2.0
    prefix_weight: float = 0.75  # a prefix expansion counts this much of a whole word
    prefix_max_words: int = 1000  # longer queries expand no prefixes (tuning: expand always)
    name_bonus: float = 5.0  # the query is exactly a tool's name


@functools.lru_cache(maxsize=1)
def _stemmer() -> Any:
    import snowballstemmer  # on first use: it costs 10+ ms to import

    return snowballstemmer.stemmer("english")


# A run's terms: its words', and those of its words joined (empty unless camelCase split it).
_RunTerms = tuple[tuple[str, ...], tuple[str, ...]]
_terms: dict[str, _RunTerms] = {}  # a run as written -> its terms


def _term(word: str) -> str:
    """Lower-cased and stemmed; "" for a stop word."""
    lowered = word.lower()
    if lowered in STOP_WORDS:
        return ""
    if lowered.isdigit():  # numbers have no stem
        return lowered
    return str(_stemmer().stemWord(lowered))


def _run_terms(run: str) -> _RunTerms:
    words = _split(run)
    terms = tuple(term for term in map(_term, words) if term)
    # A name written in camelCase is typed as one word: "github" for "GitHub", not "git hub",
    # also inside a longer run ("createGitHubIssue"), hence each two and three neighbours (a
    # brand of three words: "searchDuckDuckGo") and the whole run.
    joined = [
        "".join(words[start : start + size])
        for size in range(2, min(len(words), _JOINED_WORDS) + 1)
        for start in range(len(words) - size + 1)
    ]
    if len(words) > _JOINED_WORDS:
        joined.append(run)
    found = terms, tuple(term for term in map(_term, joined) if term)
    if len(run) <= _REMEMBERED_RUN_CHARS:
        if len(_terms) >= _TERMS_LIMIT:
            _terms.clear()
        _terms[run] = found
    return found


@functools.lru_cache(maxsize=1)
def _run_pattern() -> re.Pattern[str]:
    """Letters, digits and combining marks (which ``\\w`` leaves out: "म" + "ौ" is one word).
    Built on the first text beyond ASCII, in a few ms, from the BMP's marks."""
    marks = [c for c in range(0x300, 0x10000) if unicodedata.category(chr(c)).startswith("M")]
    ranges: list[list[int]] = []
    for code in marks:
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    marks_class = "".join(f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges)
    return re.compile(rf"(?:[^\W_]|[{marks_class}])+")


def _runs(text: str) -> list[str]:
    """Runs of letters and digits, an ASCII run not yet split on camelCase."""
    if text.isascii():  # nearly all text: one pass of the regex
        return _RUN.findall(text)
    # NFKC: "café" typed as e + U+0301 is the same word as the precomposed one, and the
    # full-width letters and digits of a Japanese keyboard (U+FF01-FF5E) the ASCII ones.
    text = unicodedata.normalize("NFKC", text)
    runs: list[str] = []
    for run in _run_pattern().findall(text):
        if _UNSPACED.search(run) is None:
            runs.append(run)
        else:
            for part in _SCRIPT_PARTS.findall(run):
                if len(part) > 1 and _UNSPACED.match(part):
                    runs += [part[i : i + 2] for i in range(len(part) - 1)]
                else:
                    runs.append(part)
    return runs


def _split(run: str) -> list[str]:
    """The words of a run: camelCase splits ASCII runs only ("MünchenPlan" stays one word)."""
    return _WORD.findall(run) if run.isascii() else [run]


def split_words(text: str) -> list[str]:
    """Words of ``text`` split on punctuation and camelCase, lower-cased (no stems)."""
    return [word.lower() for run in _runs(text) for word in _split(run)]


def tokenize(text: str) -> list[str]:
    """Terms of ``text``: words split on punctuation and camelCase, lower-cased and stemmed,
    without stop words, then the words camelCase split joined, each two and three neighbours and
    the whole run ("GitHubApp": "git", "hub", "app", "github", "hubapp", "githubapp")."""
    words, joined = _analyse(text)
    return words + joined


def _analyse(text: str) -> tuple[list[str], list[str]]:
    """``tokenize``'s terms in two lists: of the words, and of the words joined (another spelling
    of those words, not more of them: they do not lengthen a field)."""
    cache = _terms
    words: list[str] = []
    joined: list[str] = []
    for run in _runs(text):
        found = cache.get(run)
        if found is None:
            found = _run_terms(run)
        run_words, run_joined = found
        words += run_words
        joined += run_joined
    return words, joined


@dataclass(slots=True)
class _Doc:
    terms: tuple[str, ...]
    lengths: tuple[int, ...]
    name: str
    joined_only: tuple[str, ...]  # terms it holds only as camelCase words joined


_FIELD_BITS = 8  # a term's frequencies in the five fields, packed into one int (255 at most each)
_FIELD_MAX = (1 << _FIELD_BITS) - 1


class SearchIndex:
    """An incremental BM25F index from keys to tool definitions."""

    def __init__(self, ranking: Ranking | None = None) -> None:
        self.ranking = ranking or Ranking()
        if len(self.ranking.weights) != len(FIELDS) or len(self.ranking.b) != len(FIELDS):
            raise ValueError(f"Ranking needs one weight and one b per field {FIELDS}")
        self._docs: dict[str, _Doc] = {}
        self._postings: dict[str, dict[str, int]] = {}  # term -> key -> packed frequencies
        self._length_sums = [0] * len(FIELDS)
        self._vocabulary: list[str] | None = None
        self._by_name: dict[str, set[str]] = {}
        self._joined_only: dict[str, int] = {}  # term -> documents holding it only joined
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
        counts = [Counter(words) for words, _ in fields]
        # Terms it holds only joined, which prefixes do not complete (``_with_prefix``).
        joined_only = {
            term
            for _, joined in fields
            for term in joined
            if not any(term in field_counts for field_counts in counts)
        }
        packed: dict[str, int] = {}
        for index, (field_counts, (_, joined)) in enumerate(zip(counts, fields, strict=True)):
            if joined:
                field_counts.update(joined)
            shift = index * _FIELD_BITS
            for term, count in field_counts.items():
                packed[term] = packed.get(term, 0) | min(count, _FIELD_MAX) << shift
        doc = _Doc(
            terms=tuple(packed),
            lengths=tuple(len(words) for words, _ in fields),
            name=definition.name.lower(),
            joined_only=tuple(joined_only),
        )
        self._docs[key] = doc
        self._by_name.setdefault(doc.name, set()).add(key)
        for term in doc.joined_only:
            self._joined_only[term] = self._joined_only.get(term, 0) + 1
        all_postings = self._postings
        for term, freqs in packed.items():
            postings = all_postings.get(term)
            if postings is None:
                all_postings[term] = {key: freqs}
                self._vocabulary = None
            else:
                postings[key] = freqs
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
        for term in doc.joined_only:
            self._joined_only[term] -= 1
            if not self._joined_only[term]:
                del self._joined_only[term]
        for term in doc.terms:
            postings = self._postings[term]
            del postings[key]
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
        terms = []
        query = query[:MAX_QUERY_CHARS]
        for term, weight in self._query_terms(tokenize(query)).items():
            contributions = self._term_scores.get(term)
            if contributions is None:
                contributions = self._term_scores[term] = self._score_term(term)
            terms.append((contributions, weight))
        # The longest posting list is copied whole (at C speed); only the others are looped over.
        terms.sort(key=lambda item: (item[1] != 1.0, -len(item[0])))
        for contributions, weight in terms:
            if not scores and weight == 1.0:
                scores = dict(contributions)
                continue
            get = scores.get
            if weight == 1.0:
                for key, value in contributions.items():
                    scores[key] = get(key, 0.0) + value
            else:
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
            best = _top(scores, limit)
            if accept is None:
                return best
            kept = [item for item in best if accept(item[0])]
            if len(kept) == len(best):
                return kept
        if accept is not None:  # filtered before sorting: a session that may call few tools
            scores = {key: value for key, value in scores.items() if accept(key)}
        return _top(scores, limit) if limit is not None else sorted(scores.items(), key=_best_first)

    def _score_term(self, term: str) -> dict[str, float]:
        """idf x saturated pseudo-frequency of ``term`` for every document holding it."""
        ranking = self.ranking
        postings = self._postings[term]
        total = len(self._docs)
        idf = math.log(1.0 + (total - len(postings) + 0.5) / (len(postings) + 0.5))
        averages = [max(s / total, 1e-9) for s in self._length_sums]
        fields = tuple(zip(ranking.weights, ranking.b, averages, strict=True))
        k1 = ranking.k1
        docs = self._docs
        out: dict[str, float] = {}
        for key, packed in postings.items():
            lengths = docs[key].lengths
            pseudo = 0.0
            for index, (weight, b, average) in enumerate(fields):
                freq = packed >> (index * _FIELD_BITS) & _FIELD_MAX
                if freq:
                    pseudo += weight * freq / (1.0 - b + b * lengths[index] / average)
            if pseudo:
                out[key] = idf * pseudo / (k1 + pseudo)
        return out

    def _query_terms(self, words: list[str]) -> dict[str, float]:
        """Query words present in the index, plus prefix expansions of the missing ones (of
        three letters or more, or one character of a script written without spaces: those are
        indexed as pairs), in queries of at most ``prefix_max_words`` words."""
        weights: dict[str, float] = {}
        expand = len(words) <= self.ranking.prefix_max_words
        for word in words:
            if word in self._postings:
                weights[word] = max(weights.get(word, 0.0), 1.0)
            elif expand and (len(word) >= 3 or _UNSPACED.match(word)):
                # "calc" -> calculator; "雨" -> the pairs it starts ("雨天", "雨量", ...)
                for term in self._with_prefix(word):
                    weights[term] = max(weights.get(term, 0.0), self.ranking.prefix_weight)
        return weights

    def _with_prefix(self, prefix: str, limit: int = 20) -> list[str]:
        if self._vocabulary is None:
            self._vocabulary = sorted(self._postings)
        vocabulary = self._vocabulary
        out: list[str] = []
        for index in range(bisect.bisect_left(vocabulary, prefix), len(vocabulary)):
            term = vocabulary[index]
            if len(out) == limit or not term.startswith(prefix):
                break
            # Only terms some tool holds as a word, not only as camelCase words joined: "rent"
            # completed to "rentalcar" as well as to "rental" would count RentalCars twice.
            if len(self._postings[term]) > self._joined_only.get(term, 0):
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


def _top(scores: dict[str, float], limit: int) -> list[tuple[str, float]]:
    """The ``limit`` best items, best first, ties by key: the cut-off score is found on the bare
    values (fast), then only the items at or above it are sorted."""
    if len(scores) <= limit:
        return sorted(scores.items(), key=_best_first)
    if limit <= 0:
        return []
    cutoff = heapq.nlargest(limit, scores.values())[-1]
    return sorted(((k, v) for k, v in scores.items() if v >= cutoff), key=_best_first)[:limit]


def _best_first(item: tuple[str, float]) -> tuple[float, str]:
    return -item[1], item[0]


_Analysed = tuple[Sequence[str], Sequence[str]]  # terms of the words, and of the words joined


def _fields(definition: ToolDefinition) -> list[_Analysed]:
    params: list[_Analysed] = []
    param_descriptions: list[_Analysed] = []
    for parameter, named in _walk(definition.input_parameters):
        if named:
            params.append(_analyse_repeated(parameter.name))
        if parameter.description:
            param_descriptions.append(_analyse_repeated(parameter.description))
    return [
        _analyse(definition.name),
        _concatenated(map(_analyse, definition.tags)),
        _concatenated(params),
        _analyse(definition.description),
        _concatenated(param_descriptions),
    ]


def _concatenated(parts: Iterable[_Analysed]) -> _Analysed:
    words: list[str] = []
    joined: list[str] = []
    for part_words, part_joined in parts:
        words += part_words
        joined += part_joined
    return words, joined


_repeated: dict[str, _Analysed] = {}


def _analyse_repeated(text: str) -> _Analysed:
    """``_analyse`` for texts that recur across a catalogue (parameter names and descriptions:
    an API's ``owner``, ``per_page``, ... come back in hundreds of operations)."""
    found = _repeated.get(text)
    if found is None:
        if len(_repeated) >= _TERMS_LIMIT // 4:
            _repeated.clear()
        words, joined = _analyse(text)
        found = _repeated[text] = tuple(words), tuple(joined)
    return found


def _walk(
    parameters: Iterable[ToolParameter], named: bool = True
) -> Iterable[tuple[ToolParameter, bool]]:
    """Every parameter, nested ones included: an object's ``properties`` and an array's
    ``items`` (the element, whose own name, "items", is not the author's: ``named`` is False)."""
    for parameter in parameters:
        yield parameter, named
        if parameter.properties:
            yield from _walk(parameter.properties.values())
        if parameter.items is not None:
            yield from _walk((parameter.items,), named=False)
