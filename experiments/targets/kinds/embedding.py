"""Embedding models (sentence encoders): one forward pass per request, so E2E and embeddings/s measure them
and no rung that works on decode steps applies. Queries and passages to embed (the built-in retrieval set, or the
user's file: experiments/targets/retrieval_file.py); recall@k of queries against passages, and the cosine of each
embedding to the fp32 baseline's (fidelity)."""
from __future__ import annotations

from pathlib import Path

from experiments.core.errors import ConfigError
from experiments.core.names import ENCODER_METRICS
from experiments.judge.embedding_eval import (
    TASK_NAME,
    USER_TASK_NAME,
    BaselineEmbeddings,
    embed_token_ids,
    judge_cosine,
    recall_at_k,
    tokenized,
)
from experiments.targets import retrieval_file
from experiments.targets.kinds.base import Kind, load_tokenizer
from experiments.targets.models.hf_folder import check_pooling
from experiments.targets.models.minilm import RetrievalSet
from experiments.targets.workload import Workload


class EmbeddingKind(Kind):
    name = "embedding"
    noun = "encoder"
    decodes = False
    metrics = ENCODER_METRICS
    engines = {"torch": "experiments.serving.backends.pytorch.encoder:TorchEncoder",
               "onnxruntime": "experiments.serving.backends.onnxruntime.encoder:OrtEncoder",
               "openvino": "experiments.serving.backends.openvino.encoder:OpenVinoEncoder"}
    folders = "encoders (*Model or a sentence-transformers folder)"
    packaged_as = "an embedding pyfunc (texts in, L2-normalised vectors out)"
    throughput_unit = "embeddings/s"
    key_metrics = ("e2e_ms_p50", "embeddings_per_s")

    def columns(self, top: int) -> list[tuple[str, str, str]]:
        return [("e2e_ms_p50", "E2E p50 ms (c=1)", "%.2f"), ("throughput", f"embeddings/s (c={top})", "%.0f"),
                ("accuracy", "accuracy", "%.3f")]

    def throughput(self, level) -> float:
        return level.qps

    def level_metrics(self, level) -> dict[str, float]:
        return {"embeddings_per_s": level.qps, "input_tokens_per_s": level.input_tokens_per_s,
                "batch_size_mean": level.batch_size_mean}

    def claims(self, path: Path, architecture: str) -> bool:
        return (path / "modules.json").exists() or architecture.endswith("Model")

    def check(self, cfg, model_dir: Path | None = None) -> None:
        """The scoring settings, related to each other and to the user's file of texts and pairs (read here:
        a bad line is refused before anything is recorded). No tokenizer needed."""
        sc = cfg.target.scoring
        if not 0 < float(sc.min_cosine_min) <= float(sc.min_cosine_mean) <= 1:
            raise ConfigError(f"target.scoring cosine bounds must satisfy 0 < min_cosine_min <= min_cosine_mean "
                              f"<= 1, got {sc.min_cosine_min}, {sc.min_cosine_mean}", "e.g. 0.95 and 0.99")
        if isinstance(cfg.target.workload.get("prompts"), str):
            own = retrieval_file.read(Path(cfg.target.workload.prompts))
            retrieval_file.check_recall_at(cfg.target.workload.prompts, own, list(sc.recall_at))
        elif max(int(k) for k in sc.recall_at) > int(sc.queries):
            raise ConfigError(f"target.scoring.recall_at {list(sc.recall_at)} asks for more passages than the "
                              f"{sc.queries} queries have", "keep every k <= target.scoring.queries")

    def folder_texts(self, cfg_target, path: Path) -> list[str]:
        check_pooling(path)
        if isinstance(cfg_target.workload.get("prompts"), str):   # read by the scorer (experiments/targets/retrieval_file.py)
            return []
        return RetrievalSet.from_stdlib(int(cfg_target.workload.texts), int(cfg_target.workload.seed)).texts()

    # The roofline's ModelShape counts a Llama decoder (gated MLP, LM head, causal attention): an encoder's
    # bounds would be about 2.4x off for MiniLM, so none is placed rather than a wrong one.

    def scorer(self, cfg, target, texts: list[str], include_path: Path | None) -> "EmbeddingScorer":
        return EmbeddingScorer(cfg, target, texts, include_path)


KIND = EmbeddingKind()


class EmbeddingScorer:
    def __init__(self, cfg, target, texts: list[str], include_path: Path | None):
        KIND.check(cfg)
        self.cfg, self.texts = cfg, texts
        self.scoring = sc = cfg.target.scoring
        self.task, self.extra = TASK_NAME, ()
        if isinstance(cfg.target.workload.get("prompts"), str):   # the user's own texts, and pairs to retrieve
            own = retrieval_file.read(Path(cfg.target.workload.prompts))
            self.texts, self.retrieval, self.extra, self.task = own.texts(), own.retrieval, own.extra, USER_TASK_NAME
        else:
            self.retrieval = RetrievalSet.from_stdlib(int(sc.queries), int(cfg.seed))
        self.tokenizer = load_tokenizer(target.model_dir)
        self.reference = None   # the fp32 baseline's embeddings of the same texts, once measured

    def workload(self) -> Workload:
        wl, cfg = self.cfg.target.workload, self.cfg
        count = int(wl.get("requests", wl.get("prompts")))
        return Workload.from_sentences(self.texts, self.tokenizer, count, max(8, cfg.benchmark.warmup_requests),
                                       cfg.seed, int(wl.max_tokens), KIND.name)

    def score(self, engine, stage, name: str) -> tuple[list, object]:
        """(recall@k AccuracyReports, the cosines to the baseline's embeddings)."""
        sc, rs = self.scoring, self.retrieval
        texts = [*(rs.texts() if rs else []), *self.extra]
        token_ids = tokenized(self.tokenizer, texts, int(self.cfg.target.workload.max_tokens))
        what = f"{len(rs.queries)} queries and their passages" if rs else ""
        what = " and ".join(filter(None, [what, f"{len(self.extra)} texts" if self.extra else ""]))
        with stage(f"{name}: {what} embedded in the {engine.name} engine"):
            # one pass serves both criteria: retrieval, and the cosine of the same embeddings to the baseline's
            embeddings = embed_token_ids(lambda batch: engine.embed(batch)[0], token_ids, int(sc.batch_size))
        acc = []
        if rs:   # the recall of the user's pairs, or of the built-in retrieval set
            queries, passages = embeddings[:len(rs.queries)], embeddings[len(rs.queries):len(rs.texts())]
            acc = [recall_at_k(queries, passages, rs.relevant, int(k), self.task) for k in sc.recall_at]
        if self.reference is None:
            self.reference = BaselineEmbeddings(tuple(map(tuple, token_ids)), int(sc.batch_size), embeddings)
        return acc, self.reference.against(embeddings)

    def judge(self, report) -> list:
        """The gate's criteria (gate.Criterion) on the cosines."""
        return [judge_cosine(report, float(self.scoring.min_cosine_mean), float(self.scoring.min_cosine_min))]
