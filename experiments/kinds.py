"""What differs between target kinds, in one place: the load a kind's requests make, and how a candidate's
answers are scored against the baseline's.

causal-lm: prompts of mixed input and output lengths; lm-eval tasks run in the candidate's own engine, and the
next-token drift from the baseline on fixed windows (fidelity). embedding: queries and passages to embed;
recall@k of queries against passages, and the cosine of each embedding to the fp32 baseline's (fidelity).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from experiments.accuracy import AccuracyReport, check_tasks, evaluate
from experiments.workload import Workload
from experiments.errors import ConfigError
from experiments.gate import Criterion
from experiments.models.hf_folder import context_length
from experiments.task_data import check_offline


@dataclass(frozen=True)
class Drift:
    """How far a causal LM's answers moved from the baseline's: next-token fidelity on held-out windows, and
    generation agreement on workload prompts (when target.agreement asks for it)."""
    fidelity: object                 # fidelity.FidelityReport
    agreement: object | None = None  # agreement.AgreementReport

    def to_metrics(self) -> dict[str, float]:
        return {**self.fidelity.to_metrics(), **(self.agreement.to_metrics() if self.agreement else {})}


@dataclass(frozen=True)
class Reference:
    """The baseline's side of Drift, recorded once."""
    logprobs: object                 # fidelity.BaselineLogprobs
    generations: object | None       # agreement.BaselineGenerations


class CausalLM:
    def __init__(self, cfg, target, texts: list[str], include_path: Path | None):
        from experiments.fidelity import fixed_sequences

        self.cfg, self.texts, self.include_path = cfg, texts, include_path
        self.tasks = list(cfg.accuracy.tasks)
        if self.tasks or include_path is not None:
            check_tasks(self.tasks, include_path)
            check_offline(self.tasks, include_path)
        self.tokenizer = _tokenizer(target.model_dir)
        config = json.loads((Path(target.model_dir) / "config.json").read_text())
        self.context_length = context_length(config)
        self.stop_ids = _stop_ids(config, self.tokenizer)
        self.agreement = cfg.target.get("agreement")   # null: not a criterion (the built-ins gate on lm-eval)
        fid = cfg.gate.fidelity
        self.windows = fixed_sequences(self.tokenizer, texts, int(fid.sequences), int(fid.length), cfg.seed)
        self.reference = None   # Reference: the baseline's, once measured

    def workload(self) -> Workload:
        from experiments import prompts_file

        wl, cfg = self.cfg.target.workload, self.cfg
        warmup = max(8, cfg.benchmark.warmup_requests)
        if isinstance(wl.get("prompts"), str):   # the user's own requests
            requests = prompts_file.read(Path(wl.prompts), self.tokenizer, wl.output_tokens, self.context_length,
                                         cfg.seed)
            return prompts_file.workload(requests, warmup, cfg.seed)
        longest = max(wl.input_tokens) + max(wl.output_tokens) + int(wl.get("shared_prefix_tokens", 0))
        if self.context_length is not None and longest > self.context_length:
            raise ConfigError(f"target.workload asks for up to {longest} tokens (input + output + shared prefix), "
                              f"more than the model's context window of {self.context_length}",
                              "lower target.workload.input_tokens or output_tokens")
        count = int(wl.get("requests", wl.get("prompts")))
        return Workload.from_texts(self.texts, self.tokenizer, wl.input_tokens, wl.output_tokens, count,
                                   warmup, cfg.seed, wl.shared_prefix_tokens)

    def score(self, engine, stage, name: str) -> tuple[list[AccuracyReport], Drift]:
        from experiments.agreement import BaselineGenerations
        from experiments.fidelity import BaselineLogprobs

        cfg = self.cfg
        acc = []
        if self.tasks:
            with stage(f"{name}: lm-eval in the {engine.name} engine") as st:
                acc = evaluate(engine.lm_eval_model(int(cfg.accuracy.batch_size)), self.tasks,
                               cfg.gate.accuracy.metric, self.include_path, cfg.accuracy.limit, cfg.seed,
                               st.progress)
        with stage(f"{name}: fidelity against the baseline") as st:
            # Against the original baseline, not the champion, so drift cannot build up rung by rung.
            if self.reference is None:
                generations = None
                if self.agreement:
                    prompts = [p.token_ids for p in self.workload().prompts[:int(self.agreement.prompts)]]
                    generations = BaselineGenerations.record(engine, prompts, int(self.agreement.tokens),
                                                             self.stop_ids)
                self.reference = Reference(BaselineLogprobs.record(engine, self.windows), generations)
            ref = self.reference
            agreement = ref.generations.compare(engine, st.progress) if ref.generations is not None else None
            return acc, Drift(ref.logprobs.compare(engine, st.progress), agreement)

    def judge(self, drift: Drift) -> list[Criterion]:
        from experiments import agreement
        from experiments.fidelity import judge

        fid, confidence = self.cfg.gate.fidelity, self.cfg.gate.confidence
        criteria = [judge(drift.fidelity, fid.max_kl, fid.min_top1, confidence)]
        if drift.agreement is not None:
            criteria.append(agreement.judge(drift.agreement, float(self.agreement.min_share), confidence))
        return criteria


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
        count = int(wl.get("requests", wl.get("prompts")))
        return Workload.from_sentences(self.texts, self.tokenizer, count, max(8, cfg.benchmark.warmup_requests),
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

    def judge(self, report) -> list[Criterion]:
        from experiments.embedding_eval import judge_cosine

        return [judge_cosine(report, float(self.scoring.min_cosine_mean), float(self.scoring.min_cosine_min))]


KINDS = {"causal-lm": CausalLM, "embedding": Embedding}


def for_target(cfg, target, texts: list[str], include_path: Path | None):
    if target.kind not in KINDS:
        raise ConfigError(f"target.kind {target.kind!r} is unknown", f"use one of: {', '.join(KINDS)}")
    return KINDS[target.kind](cfg, target, texts, include_path)


def _stop_ids(config: dict, tokenizer) -> list[int]:
    """End-of-sequence ids from the model's config (an id or a list) and its tokenizer."""
    eos = config.get("eos_token_id")
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(ids | ({tokenizer.eos_token_id} - {None}))


def _tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
