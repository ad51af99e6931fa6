"""Causal LMs: decoded token by token, so TTFT, TPOT and tokens/s measure them and the rungs that batch decode
steps, reuse a KV cache or train a smaller decoder apply. Prompts of mixed input and output lengths; lm-eval
tasks run in the candidate's own engine, and the next-token drift from the baseline on fixed windows
(fidelity, and generation agreement where target.agreement asks for it)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from experiments.analyse.roofline import ModelShape
from experiments.core.errors import ConfigError
from experiments.core.names import LATENCY_METRICS
from experiments.judge import agreement
from experiments.judge.accuracy import check_tasks, evaluate, gated
from experiments.judge.agreement import BaselineGenerations
from experiments.judge.fidelity import BaselineLogprobs, fixed_sequences, judge
from experiments.targets import prompts_file
from experiments.targets.kinds.base import Kind, load_tokenizer
from experiments.targets.models.corpus import check_corpus, corpus_texts
from experiments.targets.models.hf_folder import context_length
from experiments.targets.models.tiny_llm import SHIPPED_TASKS
from experiments.targets.task_data import check_offline
from experiments.targets.workload import Workload


class CausalLMKind(Kind):
    name = "causal-lm"
    noun = "causal LM"
    decodes = True
    metrics = LATENCY_METRICS
    engines = {"torch": "experiments.serving.backends.pytorch.causal_lm:TorchEngine",
               "onnxruntime": "experiments.serving.backends.onnxruntime.causal_lm:OrtGenaiEngine",
               "openvino": "experiments.serving.backends.openvino.causal_lm:OpenVinoCausalLM",
               "vllm": "experiments.serving.backends.vllm.causal_lm:VllmEngine",
               "llama.cpp": "experiments.serving.backends.llama_cpp.causal_lm:LlamaCppEngine",
               "sglang": "experiments.serving.backends.sglang.causal_lm:SglangEngine",
               "tensorrt-llm": "experiments.serving.backends.tensorrt_llm.causal_lm:TensorRtLlmEngine"}
    # torch with recipe.cuda_graph: the decode step replayed from a captured graph
    cuda_graph_engine = "experiments.serving.backends.pytorch.cuda_graph:CudaGraphEngine"
    folders = "causal LMs (*ForCausalLM)"
    packaged_as = "a text-generation pyfunc"
    throughput_unit = "tokens/s"
    key_metrics = ("e2e_ms_p50", "tpot_ms_p50", "output_tokens_per_s")

    def columns(self, top: int) -> list[tuple[str, str, str]]:
        return [("ttft_ms_p50", "TTFT p50 ms (c=1)", "%.2f"), ("tpot_ms_p50", "TPOT p50 ms (c=1)", "%.3f"),
                ("throughput", f"tokens/s (c={top})", "%.0f"), ("accuracy", "accuracy", "%.3f")]

    def throughput(self, level) -> float:
        return level.output_tokens_per_s

    def level_metrics(self, level) -> dict[str, float]:
        return {"output_tokens_per_s": level.output_tokens_per_s}

    def engine(self, recipe) -> str | None:
        if recipe.cuda_graph and recipe.engine == "torch":
            return self.cuda_graph_engine
        return super().engine(recipe)

    def claims(self, path: Path, architecture: str) -> bool:
        return architecture.endswith("ForCausalLM") and not (path / "modules.json").exists()

    def check(self, cfg, model_dir: Path | None = None) -> None:
        """The tasks and the metric each is gated on (a built-in's shipped tasks from their YAML: no build
        needed); with the user's folder already on disk, also the tasks' data (offline?) and the workload against
        its tokenizer and context window: a bad prompts line is refused before anything is recorded, not after
        the experiment is created."""
        if cfg.target.workload.get("corpus"):
            check_corpus(cfg.target.workload.corpus)
        if isinstance(cfg.target.workload.get("prompts"), str):
            prompts_file.check_lines(Path(cfg.target.workload.prompts))
        tasks = list(cfg.accuracy.tasks)
        include = Path(cfg.accuracy.include_path) if cfg.accuracy.include_path else None
        if include is not None or tasks:
            index_from = include or (SHIPPED_TASKS if str(cfg.target.source).startswith("builtin:") else None)
            check_tasks(tasks, index_from)
            gated(tasks, index_from, cfg.gate.accuracy.get("metric"))
        if model_dir is None:
            return
        if tasks or include is not None:
            check_offline(tasks, include)
        context = context_length(json.loads((Path(model_dir) / "config.json").read_text()))
        wl = cfg.target.workload
        if isinstance(wl.get("prompts"), str):
            prompts_file.read(Path(wl.prompts), load_tokenizer(model_dir), wl.output_tokens, context, cfg.seed)
        else:
            check_window(wl, context)

    def folder_texts(self, cfg_target, path: Path) -> list[str]:
        return corpus_texts(cfg_target.workload.get("corpus"))

    def roofline_shape(self, model_dir: Path):
        from transformers import AutoConfig  # heavy

        return ModelShape.from_config(AutoConfig.from_pretrained(model_dir))

    def scorer(self, cfg, target, texts: list[str], include_path: Path | None) -> "CausalLMScorer":
        return CausalLMScorer(cfg, target, texts, include_path)


KIND = CausalLMKind()


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


class CausalLMScorer:
    def __init__(self, cfg, target, texts: list[str], include_path: Path | None):
        self.cfg, self.texts, self.include_path = cfg, texts, include_path
        self.tasks = list(cfg.accuracy.tasks)
        self.gated = []   # task_metrics.GatedMetric per task
        if self.tasks or include_path is not None:
            check_tasks(self.tasks, include_path)
            check_offline(self.tasks, include_path)
            self.gated = gated(self.tasks, include_path, cfg.gate.accuracy.get("metric"))
        self.tokenizer = load_tokenizer(target.model_dir)
        config = json.loads((Path(target.model_dir) / "config.json").read_text())
        self.context_length = context_length(config)
        self.stop_ids = _stop_ids(config, self.tokenizer)
        self.agreement = cfg.target.get("agreement")   # null: not a criterion (the built-ins gate on lm-eval)
        fid = cfg.gate.fidelity
        self.windows = fixed_sequences(self.tokenizer, texts, int(fid.sequences), int(fid.length), cfg.seed)
        self.reference = None   # Reference: the baseline's, once measured

    def workload(self) -> Workload:
        return causal_workload(self.cfg.target.workload, self.tokenizer, self.texts, self.context_length,
                               max(8, self.cfg.benchmark.warmup_requests), self.cfg.seed)

    def score(self, engine, stage, name: str) -> tuple[list, Drift]:
        """(lm-eval's AccuracyReports, the Drift from the baseline)."""
        cfg = self.cfg
        acc = []
        if self.tasks:
            with stage(f"{name}: lm-eval in the {engine.name} engine") as st:
                acc = evaluate(engine.lm_eval_model(int(cfg.accuracy.batch_size)), self.tasks,
                               cfg.gate.accuracy.metric, self.include_path, cfg.accuracy.limit, cfg.seed,
                               st.progress, first_look=cfg.accuracy.get("first_look"))
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
            agreement = None
            if ref.generations is not None:
                agreement = ref.generations.compare(engine, float(self.agreement.near_tie), st.progress)
            return acc, Drift(ref.logprobs.compare(engine, st.progress), agreement)

    def score_more(self, engine, reports: list, stage, name: str) -> list:
        """`reports` completed: the documents of the gate's last look that they lack, scored in this engine."""
        cfg, out = self.cfg, []
        for report in reports:
            rest = report.missing()
            if not rest:
                out.append(report)
                continue
            with stage(f"{name}: lm-eval in the {engine.name} engine, {len(rest)} more documents") as st:
                more = evaluate(engine.lm_eval_model(int(cfg.accuracy.batch_size)), [report.task],
                                cfg.gate.accuracy.metric, self.include_path, cfg.accuracy.limit, cfg.seed,
                                st.progress, doc_ids=rest)[0]
            out.append(report.extended(more))
        return out

    def judge(self, drift: Drift) -> list:
        """The gate's criteria (gate.Criterion) on the drift."""
        fid, confidence = self.cfg.gate.fidelity, self.cfg.gate.confidence
        criteria = [judge(drift.fidelity, fid.max_kl, fid.min_top1, confidence)]
        if drift.agreement is not None:
            criteria.append(agreement.judge(drift.agreement, float(self.agreement.min_share), confidence))
        return criteria


def causal_workload(wl, tokenizer, texts: list[str], context: int | None, warmup: int, seed: int) -> Workload:
    """The requests `target.workload` describes: the user's prompts file, or synthetic prompts cut from `texts`
    (the count from `requests`, else `prompts`, with the shared prefix), checked against the context window."""
    if isinstance(wl.get("prompts"), str):   # the user's own requests
        requests = prompts_file.read(Path(wl.prompts), tokenizer, wl.output_tokens, context, seed)
        return prompts_file.workload(requests, warmup, seed)
    check_window(wl, context)
    count = wl.get("requests") or wl.get("prompts")
    if count is None:
        raise ConfigError("target.workload gives neither a prompts file nor a number of synthetic requests",
                          "set target.workload.prompts=FILE.jsonl or target.workload.requests=N")
    return Workload.from_texts(texts, tokenizer, wl.input_tokens, wl.output_tokens, int(count), warmup, seed,
                               int(wl.get("shared_prefix_tokens") or 0))


def check_window(wl, context: int | None) -> None:
    """Synthetic prompts: the longest request must fit the model's context window."""
    longest = max(wl.input_tokens) + max(wl.output_tokens) + int(wl.get("shared_prefix_tokens", 0))
    if context is not None and longest > context:
        raise ConfigError(f"target.workload asks for up to {longest} tokens (input + output + shared prefix), "
                          f"more than the model's context window of {context}",
                          "lower target.workload.input_tokens or output_tokens")


def _stop_ids(config: dict, tokenizer) -> list[int]:
    """End-of-sequence ids from the model's config (an id or a list) and its tokenizer."""
    eos = config.get("eos_token_id")
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(ids | ({tokenizer.eos_token_id} - {None}))
