"""Tune the lexical ranker's settings (toolmesh.search.Ranking) on the dev queries only.

Coordinate ascent on mean nDCG@10 over a few values per setting, from the current defaults.
The held-out test queries are never read here.

    python bench/retrieval/tune.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evaluate import definitions, evaluate, load_queries, load_tools

from toolmesh.search import FIELDS, Ranking, SearchIndex

GRID = {
    "k1": [0.6, 0.9, 1.2, 1.6, 2.0],
    "prefix_weight": [0.0, 0.25, 0.5, 0.75],
    "prefix_max_words": [4, 8, 16, 1000],
    "name_bonus": [5.0],
}
FIELD_GRID = {"weights": [0.3, 0.6, 1.0, 1.5, 2.0, 3.0, 4.0], "b": [0.0, 0.3, 0.5, 0.75, 0.9]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    queries = load_queries("dev")
    index = SearchIndex()
    for d in definitions(load_tools()):
        index.add(d.name, d)

    def score(ranking: Ranking) -> float:
        index.ranking = ranking
        index._term_scores = {}
        r = evaluate(lambda q: [k for k, _ in index.search(q, limit=10)], queries)
        return r["ndcg@10"] + 0.5 * r["recall@1"]

    best = Ranking()
    best_score = score(best)
    print(f"start {best_score:.4f} {best}")
    for _ in range(args.rounds):
        for name, values in GRID.items():
            for value in values:
                candidate = best._replace(**{name: value})
                s = score(candidate)
                if s > best_score + 1e-4:
                    best, best_score = candidate, s
                    print(f"{s:.4f} {name}={value}")
        for name, values in FIELD_GRID.items():
            for field in range(len(best.weights)):
                if field == FIELDS.index("tags"):
                    continue  # the labelled tools have no tags: tuning would only learn that
                for value in values:
                    current = list(getattr(best, name))
                    current[field] = value
                    candidate = best._replace(**{name: tuple(current)})
                    s = score(candidate)
                    if s > best_score + 1e-4:
                        best, best_score = candidate, s
                        print(f"{s:.4f} {name}[{field}]={value}")
    print(f"best {best_score:.4f} {best}")


if __name__ == "__main__":
    main()
