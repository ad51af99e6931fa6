"""How an embedding candidate is scored: retrieval quality, and cosine drift from the fp32 baseline.

The counterpart of lm-eval plus next-token fidelity for causal LMs. Recall@k on a fixed retrieval set is the
task accuracy (an AccuracyReport with per-query hits, so the gate compares it paired, query by query);
the cosine between the candidate's and the baseline's embeddings of the same texts is the fidelity, far more
sensitive to quantization damage than a recall that only moves when a ranking flips.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from experiments.judge.accuracy import AccuracyReport
from experiments.judge.gate import Criterion

TASK_NAME = "minilm_retrieval"
USER_TASK_NAME = "retrieval_pairs"   # the user's own query/passage pairs (experiments/targets/retrieval_file.py)
TIE_TOLERANCE = 1e-9

Embed = Callable[[list[list[int]]], np.ndarray]   # token-id rows -> L2-normalised float32 [B, D]


# --- embedding texts, each engine in its own runtime ------------------------------------------------------
def tokenized(tokenizer, texts: Sequence[str], max_tokens: int = 128) -> list[list[int]]:
    """Token ids with the tokenizer's special tokens ([CLS] ... [SEP]), truncated as the encoder was trained."""
    return [list(tokenizer(text, truncation=True, max_length=max_tokens)["input_ids"]) for text in texts]


def embed_token_ids(embed: Embed, token_ids: Sequence[Sequence[int]], batch_size: int = 32) -> np.ndarray:
    """[len(token_ids), D] float32 in the rows' order, embedded in batches of at most batch_size."""
    if not token_ids:
        raise ValueError("nothing to embed")
    rows = [list(ids) for ids in token_ids]
    # Batched by length, as sentence-transformers does: a batch pads to its longest row, and padding is compute.
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    batches = [np.asarray(embed([rows[i] for i in order[start:start + batch_size]]), dtype=np.float32)
               for start in range(0, len(rows), batch_size)]
    by_length = np.concatenate(batches)
    if by_length.ndim != 2 or len(by_length) != len(rows):
        raise ValueError(f"the embed function returned shape {by_length.shape} for {len(rows)} texts; "
                         f"expected [n, D]")
    out = np.empty_like(by_length)
    out[order] = by_length
    return out


def embed_texts(embed: Embed, tokenizer, texts: Sequence[str], batch_size: int = 32,
                max_tokens: int = 128) -> np.ndarray:
    return embed_token_ids(embed, tokenized(tokenizer, texts, max_tokens), batch_size)


# --- retrieval -------------------------------------------------------------------------------------------
def recall_at_k(query_emb: np.ndarray, passage_emb: np.ndarray, relevant: Sequence[int], k: int,
                task: str = TASK_NAME) -> AccuracyReport:
    """Share of queries whose relevant passage ranks in the top k by cosine, with MRR@k alongside.

    A tie with the relevant passage counts against it: a collapsed encoder that maps every text to one
    vector must score 0, not a perfect recall.
    """
    q, p = _unit_rows(query_emb), _unit_rows(passage_emb)
    relevant = np.asarray(relevant, dtype=np.int64)
    if len(relevant) != len(q) or not 1 <= k <= len(p):
        raise ValueError(f"{len(q)} queries with {len(relevant)} relevant indices, k={k} of {len(p)} passages")
    scores = q @ p.T
    own = scores[np.arange(len(q)), relevant]
    # 1 when only the relevant passage scores that high; the tolerance absorbs float64 rounding in the
    # matrix product (equal rows can differ in the last bits), far below any real difference in cosine.
    rank = (scores >= own[:, None] - TIE_TOLERANCE).sum(axis=1)
    hits = (rank <= k).astype(np.float64)
    reciprocal = np.where(rank <= k, 1.0 / rank, 0.0)
    recall, mrr = float(hits.mean()), float(reciprocal.mean())
    # Binomial standard error sqrt(p(1-p)/n) of one candidate's recall, as logged and drawn as error bars.
    # The gate's z-test (Gate.accuracy) pairs the per-query hits in per_doc instead: champion and
    # challenger answer the same queries, so their difference has a far smaller standard error.
    stderr = float(np.sqrt(recall * (1 - recall) / len(hits)))
    metric = f"recall@{k}"
    row = {metric: recall, f"{metric}_stderr": stderr, f"mrr@{k}": mrr, "n_queries": len(hits),
           "n_passages": len(p)}
    return AccuracyReport(
        task=task, metric=metric, value=recall, stderr=stderr, per_doc=tuple(hits.tolist()),
        results={"results": {task: row},
                 "per_query": {"hit": hits.tolist(), "rank": rank.tolist(), "reciprocal_rank": reciprocal.tolist()}})


# --- drift from the baseline -----------------------------------------------------------------------------
@dataclass(frozen=True)
class CosineReport:
    n: int
    mean: float
    min: float
    p05: float    # 5th percentile: a few damaged texts show here before they move the mean

    @classmethod
    def from_cosines(cls, cosines: np.ndarray) -> "CosineReport":
        values = np.asarray(cosines, dtype=np.float64)
        return cls(n=len(values), mean=float(values.mean()), min=float(values.min()),
                   p05=float(np.percentile(values, 5)))

    def to_metrics(self) -> dict[str, float]:
        return {"cosine_mean": self.mean, "cosine_min": self.min, "cosine_p05": self.p05}


@dataclass(frozen=True)
class BaselineEmbeddings:
    """The baseline's embeddings of fixed texts, recorded once so the baseline engine need not stay alive.

    The token ids are kept, not the texts: the candidate embeds exactly what the baseline did, in the same
    batches, so padding cannot differ between the two.
    """
    token_ids: tuple[tuple[int, ...], ...] = field(repr=False)
    batch_size: int
    embeddings: np.ndarray = field(repr=False)   # [n, D] float32

    @classmethod
    def record(cls, embed: Embed, tokenizer, texts: Sequence[str], batch_size: int = 32,
               max_tokens: int = 128) -> "BaselineEmbeddings":
        ids = tuple(tuple(row) for row in tokenized(tokenizer, texts, max_tokens))
        return cls(ids, batch_size, embed_token_ids(embed, ids, batch_size))

    def compare(self, embed: Embed) -> CosineReport:
        return self.against(embed_token_ids(embed, self.token_ids, self.batch_size))

    def against(self, candidate: np.ndarray) -> CosineReport:
        """The cosine report of embeddings a candidate already made of the same texts, in the same order."""
        if candidate.shape != self.embeddings.shape:
            raise ValueError(f"candidate embeddings {candidate.shape} vs baseline {self.embeddings.shape}")
        return CosineReport.from_cosines((_unit_rows(candidate) * _unit_rows(self.embeddings)).sum(axis=1))


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length in float64, whatever the engine claims: cosine must not trust normalisation.
    A zero row stays zero (cosine 0 with anything), so a dead output fails instead of turning into NaN."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


# --- the gate criterion ----------------------------------------------------------------------------------
def judge_cosine(report: CosineReport, min_mean: float, min_min: float) -> Criterion:
    """Named "fidelity" like the causal-LM drift criterion, so the gate treats both alike."""
    mean_ok, min_ok = report.mean >= min_mean, report.min >= min_min
    detail = (f"cosine vs fp32 baseline: mean {report.mean:.4f} ({'>=' if mean_ok else '<'} {min_mean:g}), "
              f"min {report.min:.4f} ({'>=' if min_ok else '<'} {min_min:g}) over {report.n} texts")
    return Criterion("fidelity", mean_ok and min_ok, detail,
                     {"cosine_mean": report.mean, "cosine_min": report.min, "cosine_p05": report.p05,
                      "min_mean": min_mean, "min_min": min_min, "n_texts": float(report.n)})
