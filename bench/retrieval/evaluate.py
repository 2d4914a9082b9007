"""Score tool rankers on the labelled retrieval set (tools.json.gz, queries.jsonl.gz).

Metrics per query, averaged: recall@k is the share of the relevant tools found in the first k,
out of at most k (a query whose request needs four tools can still reach 1.0 at k=1: BEIR's
capped recall), and nDCG@10 with binary gains.

    python bench/retrieval/evaluate.py [--split dev|test|all] [--rankers lexical,bm25,...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))

from toolmesh import ToolDefinition  # noqa: E402
from toolmesh.schema import schema_to_parameters  # noqa: E402

Ranker = Callable[[str], list[str]]


def load_tools() -> list[dict[str, Any]]:
    with gzip.open(HERE / "tools.json.gz", "rt", encoding="utf-8") as f:
        tools: list[dict[str, Any]] = json.load(f)
    return tools


def load_queries(split: str = "all") -> list[dict[str, Any]]:
    with gzip.open(HERE / "queries.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if split in ("all", r["split"])]


def definitions(tools: Iterable[dict[str, Any]]) -> list[ToolDefinition]:
    return [
        ToolDefinition(
            name=t["name"],
            description=t["description"],
            tags=t["tags"],
            input_parameters=schema_to_parameters(t["input_schema"]),
        )
        for t in tools
    ]


def scores(ranked: Sequence[str], relevant: set[str]) -> tuple[float, float, float]:
    def recall(k: int) -> float:
        return sum(name in relevant for name in ranked[:k]) / min(k, len(relevant))

    dcg = sum(1 / math.log2(i + 2) for i, name in enumerate(ranked[:10]) if name in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(10, len(relevant))))
    return recall(1), recall(5), dcg / ideal


def evaluate(ranker: Ranker, queries: Sequence[dict[str, Any]]) -> dict[str, float]:
    totals = [0.0, 0.0, 0.0]
    started = time.perf_counter()
    for q in queries:
        for i, value in enumerate(scores(ranker(q["query"]), set(q["relevant"]))):
            totals[i] += value
    elapsed = time.perf_counter() - started
    n = max(len(queries), 1)
    return {
        "recall@1": totals[0] / n,
        "recall@5": totals[1] / n,
        "ndcg@10": totals[2] / n,
        "ms_per_query": 1000 * elapsed / n,
        "queries": len(queries),
    }


# -- rankers --------------------------------------------------------------------------------------


def substring_ranker(defs: Sequence[ToolDefinition]) -> Ranker:
    """Seed 000's default ``_search_tools``: the query as a substring of name/description/tags."""
    texts = [(d.name, " ".join([d.name, d.description, *d.tags]).lower()) for d in defs]

    def rank(query: str) -> list[str]:
        wanted = query.lower().strip()
        return [name for name, text in texts if wanted in text]

    return rank


def substring_words_ranker(defs: Sequence[ToolDefinition]) -> Ranker:
    """A kinder substring match: tools ranked by how many query words they contain."""
    texts = [(d.name, " ".join([d.name, d.description, *d.tags]).lower()) for d in defs]

    def rank(query: str) -> list[str]:
        words = {w for w in query.lower().split() if len(w) > 2}
        hits = [(sum(w in text for w in words), name) for name, text in texts]
        return [name for count, name in sorted(hits, key=lambda h: -h[0]) if count][:50]

    return rank


def _flat_text(d: ToolDefinition) -> str:
    params = " ".join(f"{p.name} {p.description}" for p in d.input_parameters)
    return " ".join([d.name.replace("_", " "), d.description, " ".join(d.tags), params])


def bm25_ranker(defs: Sequence[ToolDefinition], *, stem: bool = False) -> Ranker:
    """Plain BM25 (bm25s, its defaults: k1=1.5, b=0.75, English stop words) over one text per tool:
    name, description, tags and parameters concatenated. ``stem`` uses toolmesh's tokenizer."""
    import bm25s

    names = [d.name for d in defs]
    corpus = [_flat_text(d) for d in defs]
    if stem:
        from toolmesh.search import tokenize

        retriever = bm25s.BM25()
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(w, len(vocab)) for w in tokenize(text)] for text in corpus]
        retriever.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)

        def rank(query: str) -> list[str]:
            words = [w for w in tokenize(query) if w in vocab]
            if not words:
                return []
            scored = retriever.get_scores(words)
            order = scored.argsort()[::-1][:50]
            return [names[i] for i in order if scored[i] > 0]

        return rank
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False
    )

    def rank_plain(query: str) -> list[str]:
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        words = [w for w, i in tokens.vocab.items() if i in set(tokens.ids[0])]
        if not words:
            return []
        scored = retriever.get_scores(words)
        order = scored.argsort()[::-1][:50]
        return [names[i] for i in order if scored[i] > 0]

    return rank_plain


def lexical_ranker(defs: Sequence[ToolDefinition], **options: Any) -> Ranker:
    from toolmesh.search import SearchIndex

    index = SearchIndex(**options)
    for d in defs:
        index.add(d.name, d)

    def rank(query: str) -> list[str]:
        return [key for key, _ in index.search(query, limit=50)]

    return rank


def hybrid_ranker(defs: Sequence[ToolDefinition], **options: Any) -> Ranker:
    from toolmesh.semantic import HybridIndex

    index = HybridIndex(**options)
    for d in defs:
        index.add(d.name, d)
    index.embed_pending()

    def rank(query: str) -> list[str]:
        return [key for key, _ in index.search(query, limit=50)]

    return rank


def semantic_ranker(defs: Sequence[ToolDefinition]) -> Ranker:
    """The embeddings alone (cosine similarity), to show what the fusion adds."""
    from toolmesh.semantic import HybridIndex

    index = HybridIndex()
    for d in defs:
        index.add(d.name, d)
    index.embed_pending()
    return lambda query: [key for key, _ in index.semantic(query, 50)]


RANKERS: dict[str, Callable[[Sequence[ToolDefinition]], Ranker]] = {
    "substring": substring_ranker,
    "substring-words": substring_words_ranker,
    "bm25": bm25_ranker,
    "bm25-stemmed": lambda defs: bm25_ranker(defs, stem=True),
    "lexical": lexical_ranker,
    "semantic": semantic_ranker,
    "hybrid": hybrid_ranker,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", default="dev", choices=["dev", "test", "all"])
    parser.add_argument("--rankers", default=",".join(RANKERS))
    parser.add_argument("--by-origin", action="store_true")
    args = parser.parse_args()
    defs = definitions(load_tools())
    queries = load_queries(args.split)
    groups = {"all": queries}
    if args.by_origin:
        for q in queries:
            groups.setdefault(q["origin"], []).append(q)
    print(f"{len(defs)} tools, {len(queries)} {args.split} queries")
    for name in args.rankers.split(","):
        ranker = RANKERS[name](defs)
        for group, rows in groups.items():
            r = evaluate(ranker, rows)
            print(
                f"{name:16} {group:26} R@1 {r['recall@1']:.3f}  R@5 {r['recall@5']:.3f}  "
                f"nDCG@10 {r['ndcg@10']:.3f}  {r['ms_per_query']:.2f} ms/q"
            )


if __name__ == "__main__":
    main()
