"""Tune how the hybrid ranker fuses lexical and semantic rankings, on the dev queries only.

Compares weighted reciprocal rank fusion (over k and the semantic weight) with a score blend
(lexical score / best lexical score + alpha * cosine similarity), and prints the best of each.
A tool's cosine is its best over the query's parts (``toolmesh.semantic.query_parts``), or over
the whole query alone with --whole-query. The text embedded per tool is
``toolmesh.semantic.tool_text``.

    python bench/retrieval/tune_fusion.py [--whole-query]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from evaluate import definitions, load_queries, load_tools, scores

from toolmesh.semantic import HybridIndex, query_parts


def main() -> None:
    queries = load_queries("dev")
    index = HybridIndex()
    for d in definitions(load_tools()):
        index.add(d.name, d)
    index.embed_pending()
    keys = list(index._vectors)
    position = {k: i for i, k in enumerate(keys)}
    matrix = np.stack([index._vectors[k] for k in keys])
    whole_only = "--whole-query" in sys.argv  # compare: one vector per query, no clauses
    parts = [[q["query"]] if whole_only else query_parts(q["query"]) for q in queries]
    flat = [text for group in parts for text in group]
    vecs = index.encoder.encode(flat)
    lexical = [index.scores(q["query"]) for q in queries]
    whole = []
    clause_max = []
    at = 0
    for group in parts:
        sims = vecs[at : at + len(group)] @ matrix.T
        whole.append(sims[0])
        clause_max.append(sims.max(axis=0))
        at += len(group)
    cosines = np.stack(whole) if whole_only else np.stack(clause_max)

    def mean_metrics(rank_fn) -> tuple[float, float, float]:
        totals = np.zeros(3)
        for i, q in enumerate(queries):
            totals += scores(rank_fn(i), set(q["relevant"]))
        return tuple(totals / len(queries))

    def rrf(k: float, weight: float, depth: int = 100):
        def rank(i: int) -> list[str]:
            lex = sorted(lexical[i].items(), key=lambda kv: -kv[1])[:depth]
            sem = np.argsort(-cosines[i])[:depth]
            fused: dict[str, float] = {}
            for r, (key, _) in enumerate(lex):
                fused[key] = 1 / (k + r + 1)
            for r, j in enumerate(sem):
                fused[keys[j]] = fused.get(keys[j], 0) + weight / (k + r + 1)
            return [key for key, _ in sorted(fused.items(), key=lambda kv: -kv[1])[:10]]

        return rank

    def blend(alpha: float):
        def rank(i: int) -> list[str]:
            total = alpha * cosines[i].copy()
            best = max(lexical[i].values(), default=1.0)
            for key, value in lexical[i].items():
                total[position[key]] += value / best
            return [keys[j] for j in np.argsort(-total)[:10]]

        return rank

    results = []
    print("lexical", mean_metrics(blend(0.0)))
    for k in (1, 5, 10, 20, 60):
        for weight in (0.2, 0.35, 0.5, 0.7, 1.0):
            r = mean_metrics(rrf(k, weight))
            results.append((r[2] + 0.5 * r[0], f"rrf k={k} w={weight}", r))
    for alpha in (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0):
        r = mean_metrics(blend(alpha))
        results.append((r[2] + 0.5 * r[0], f"blend alpha={alpha}", r))
    for score, label, r in sorted(results, reverse=True)[:8]:
        print(f"{score:.4f} {label:22} R@1 {r[0]:.3f} R@5 {r[1]:.3f} nDCG@10 {r[2]:.3f}")


if __name__ == "__main__":
    main()
