"""What differs between target kinds, in one place: the load a kind's requests make, and how a candidate's
answers are scored against the baseline's.

causal-lm: prompts of mixed input and output lengths; lm-eval tasks run in the candidate's own engine, and the
next-token drift from the baseline on fixed windows (fidelity). embedding: queries and passages to embed;
recall@k of queries against passages, and the cosine of each embedding to the fp32 baseline's (fidelity).
"""
from __future__ import annotations

from pathlib import Path

from experiments.accuracy import AccuracyReport, check_tasks, evaluate
from experiments.workload import Workload
from experiments.errors import ConfigError
from experiments.gate import Criterion


class CausalLM:
    def __init__(self, cfg, target, texts: list[str], include_path: Path | None):
        from experiments.fidelity import fixed_sequences

        self.cfg, self.texts, self.include_path = cfg, texts, include_path
        check_tasks(list(cfg.accuracy.tasks), include_path)
        self.tokenizer = _tokenizer(target.model_dir)
        fid = cfg.gate.fidelity
        self.windows = fixed_sequences(self.tokenizer, texts, int(fid.sequences), int(fid.length), cfg.seed)
        self.reference = None   # the baseline's next-token log-probs, once measured

    def workload(self) -> Workload:
        wl, cfg = self.cfg.target.workload, self.cfg
        return Workload.from_texts(self.texts, self.tokenizer, wl.input_tokens, wl.output_tokens, wl.prompts,
                                   max(8, cfg.benchmark.warmup_requests), cfg.seed, wl.shared_prefix_tokens)

    def score(self, engine, stage, name: str) -> tuple[list[AccuracyReport], object]:
        from experiments.fidelity import BaselineLogprobs

        cfg = self.cfg
        with stage(f"{name}: lm-eval in the {engine.name} engine"):
            acc = evaluate(engine.lm_eval_model(int(cfg.accuracy.batch_size)), list(cfg.accuracy.tasks),
                           cfg.gate.accuracy.metric, self.include_path, cfg.accuracy.limit, cfg.seed)
        with stage(f"{name}: fidelity against the baseline"):
            # Against the original baseline, not the champion, so drift cannot build up rung by rung.
            if self.reference is None:
                self.reference = BaselineLogprobs.record(engine, self.windows)
            return acc, self.reference.compare(engine)

    def judge(self, report) -> Criterion:
        from experiments.fidelity import judge

        fid = self.cfg.gate.fidelity
        return judge(report, fid.max_kl, fid.min_top1, self.cfg.gate.confidence)


class Embedding:
    def __init__(self, cfg, target, texts: list[str], include_path: Path | None):
        from experiments.models.minilm import RetrievalSet

        self.cfg, self.texts = cfg, texts
        self.scoring = sc = cfg.target.scoring
        if not list(sc.recall_at) or any(int(k) < 1 for k in sc.recall_at):
            raise ConfigError(f"target.scoring.recall_at must list k >= 1, got {list(sc.recall_at)}",
                              "e.g. target.scoring.recall_at=[1,5]")
        if not 0 < float(sc.min_cosine_min) <= float(sc.min_cosine_mean) <= 1:
            raise ConfigError(f"target.scoring cosine bounds must satisfy 0 < min_cosine_min <= min_cosine_mean "
                              f"<= 1, got {sc.min_cosine_min}, {sc.min_cosine_mean}", "e.g. 0.95 and 0.99")
        if max(int(k) for k in sc.recall_at) > int(sc.queries):
            raise ConfigError(f"target.scoring.recall_at {list(sc.recall_at)} asks for more passages than the "
                              f"{sc.queries} queries have", "keep every k <= target.scoring.queries")
        self.tokenizer = _tokenizer(target.model_dir)
        self.retrieval = RetrievalSet.from_stdlib(int(sc.queries), int(cfg.seed))
        self.reference = None   # the fp32 baseline's embeddings of the same texts, once measured

    def workload(self) -> Workload:
        wl, cfg = self.cfg.target.workload, self.cfg
        return Workload.from_sentences(self.texts, self.tokenizer, wl.prompts, max(8, cfg.benchmark.warmup_requests),
                                       cfg.seed, int(wl.max_tokens))

    def score(self, engine, stage, name: str) -> tuple[list[AccuracyReport], object]:
        from experiments.embedding_eval import BaselineEmbeddings, embed_token_ids, recall_at_k, tokenized

        sc, rs = self.scoring, self.retrieval
        token_ids = tokenized(self.tokenizer, rs.texts(), int(self.cfg.target.workload.max_tokens))
        with stage(f"{name}: {len(rs.queries)} queries and their passages embedded in the {engine.name} engine"):
            # one pass serves both criteria: retrieval, and the cosine of the same embeddings to the baseline's
            embeddings = embed_token_ids(lambda batch: engine.embed(batch)[0], token_ids, int(sc.batch_size))
        queries, passages = embeddings[:len(rs.queries)], embeddings[len(rs.queries):]
        acc = [recall_at_k(queries, passages, rs.relevant, int(k)) for k in sc.recall_at]
        if self.reference is None:
            self.reference = BaselineEmbeddings(tuple(map(tuple, token_ids)), int(sc.batch_size), embeddings)
        return acc, self.reference.against(embeddings)

    def judge(self, report) -> Criterion:
        from experiments.embedding_eval import judge_cosine

        return judge_cosine(report, float(self.scoring.min_cosine_mean), float(self.scoring.min_cosine_min))


KINDS = {"causal-lm": CausalLM, "embedding": Embedding}


def for_target(cfg, target, texts: list[str], include_path: Path | None):
    if target.kind not in KINDS:
        raise ConfigError(f"target.kind {target.kind!r} is unknown", f"use one of: {', '.join(KINDS)}")
    return KINDS[target.kind](cfg, target, texts, include_path)


def _tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
