"""Accuracy with lm-eval, run against the candidate in its own engine."""
from __future__ import annotations

import difflib
import functools
import json
import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from lm_eval.api.model import TemplateLM

from experiments.core.errors import ConfigError
from experiments.core.gpu_guards import require_provider
from experiments.judge.task_metrics import GatedMetric, gated_metrics

# ONNX input types -> numpy dtypes: numpy has no bfloat16, so a bf16 export cannot be scored here (and says so)
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}

log = logging.getLogger(__name__)


class TokenizedLM(TemplateLM):
    """An lm-eval model over a Hugging Face tokenizer (`self.tokenizer`), encoding as HFLM does."""

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        # As HFLM: an empty context is conditioned on BOS when the tokenizer has one.
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))


class OnnxSessionLM(TokenizedLM):
    """lm-eval scoring through ONNX Runtime on the exported graph itself (same file the generator runs).

    Mirrors HFLM's causal scoring: context+continuation truncated on the left to the model's window,
    log-softmax over the continuation positions, greedy check per token.
    """

    def __init__(self, onnx_path: Path, tokenizer, threads: int, providers=("CPUExecutionProvider",)):
        super().__init__()
        import onnxruntime as ort  # heavy

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(onnx_path), opts, providers=list(providers))
        first = providers[0] if isinstance(providers[0], str) else providers[0][0]
        require_provider(self.session, first)
        self.tokenizer = tokenizer
        config = json.loads((Path(onnx_path).parent / "genai_config.json").read_text())["model"]
        self.max_length = config["context_length"]
        dec = config["decoder"]
        # the export's own dtype for its past tensors (fp16 for an fp16 export), read from the graph
        past_types = {i.name: i.type for i in self.session.get_inputs() if i.name.startswith("past_")}
        if unknown := {t for t in past_types.values() if t not in ORT_DTYPES}:
            raise ValueError(f"lm-eval scoring through ONNX Runtime feeds numpy arrays; the export's past tensors "
                             f"are {', '.join(sorted(unknown))}, which numpy cannot hold")
        past_dtypes = {name: ORT_DTYPES[t] for name, t in past_types.items()}
        self._empty_past = {
            name: np.zeros((1, dec["num_key_value_heads"], 0, dec["head_size"]), past_dtypes[name])
            for name in (f"past_key_values.{i}.{kv}" for i in range(dec["num_hidden_layers"]) for kv in ("key", "value"))}

    def _logprobs(self, tokens: list[int]) -> np.ndarray:
        ids = np.asarray([tokens], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), **self._empty_past}
        logits = self.session.run(["logits"], feeds)[0][0].astype(np.float64)
        return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        results = []
        for key, context_enc, continuation_enc in requests:
            whole = (context_enc + continuation_enc)[-(self.max_length + 1):]
            logprobs = self._logprobs(whole[:-1])[-len(continuation_enc):]
            picked = logprobs[np.arange(len(continuation_enc)), continuation_enc]
            greedy = bool((logprobs.argmax(-1) == np.asarray(continuation_enc)).all())
            results.append((float(picked.sum()), greedy))
            self.cache_hook.add_partial("loglikelihood", key, results[-1])   # as HFLM: one per request
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        out = []
        for req in requests:
            tokens = [self.eot_token_id] + self.tok_encode(req.args[0])
            total = 0.0
            for start in range(0, len(tokens) - 1, self.max_length):
                window = tokens[start: start + self.max_length + 1]
                lp = self._logprobs(window[:-1])
                total += float(lp[np.arange(len(window) - 1), window[1:]].sum())
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False):
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            until = gen_kwargs.get("until", [])
            tokens = self.tok_encode(context)[-self.max_length:]
            new: list[int] = []
            for _ in range(int(gen_kwargs.get("max_gen_toks", 64))):
                token = int(self._logprobs((tokens + new)[-self.max_length:])[-1].argmax())
                if token == self.eot_token_id:
                    break
                new.append(token)
                text = self.tokenizer.decode(new)
                if any(u in text for u in until):
                    break
            text = self.tokenizer.decode(new)
            for u in until:
                text = text.split(u)[0]
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out


def _counted(lm, method, request_type: str, progress):
    def run(requests, *args, **kwargs):
        done, hook = [0], lm.cache_hook

        class Counting:
            def add_partial(self, attr, req, res):
                hook.add_partial(attr, req, res)
                if attr == request_type:        # loglikelihood_rolling's inner calls are not requests
                    done[0] += 1
                    progress(done[0])

        progress(0, len(requests), request_type, "requests")
        lm.cache_hook = Counting()
        try:
            return method(requests, *args, **kwargs)
        finally:
            lm.cache_hook = hook
    return run


@dataclass(frozen=True)
class AccuracyReport:
    task: str
    metric: str
    value: float
    stderr: float
    per_doc: tuple[float, ...] = field(repr=False)   # the metric per document, in doc_id order
    results: dict = field(repr=False, default_factory=dict)
    doc_ids: tuple[int, ...] = field(repr=False, default=())   # () = 0, 1, ... in per_doc's order
    documents: int = 0          # the documents the gate's last look scores (0: those in per_doc)
    first_look: int = 0         # documents scored at the gate's first look (0: one look only)

    @property
    def ids(self) -> tuple[int, ...]:
        return self.doc_ids or tuple(range(len(self.per_doc)))

    @property
    def complete(self) -> bool:
        return len(self.per_doc) >= (self.documents or len(self.per_doc))

    def missing(self, wanted=None) -> list[int]:
        """Document ids of the last look (or of `wanted`) this report has not scored."""
        have = set(self.ids)
        return [i for i in (range(self.documents) if wanted is None else wanted) if i not in have]

    def at(self, ids) -> np.ndarray:
        """The per-document scores of `ids` (each one scored here), in that order: what another report's pair."""
        by_id = dict(zip(self.ids, self.per_doc))
        return np.array([by_id[i] for i in ids])

    def only(self, ids) -> "AccuracyReport":
        """This report over `ids` alone (each one scored here): the value is their per-document mean."""
        ids = tuple(sorted(ids))
        return self._over(ids, self.at(ids))

    def extended(self, more: "AccuracyReport") -> "AccuracyReport":
        """This report and `more` (other documents of the same task) as one. The value is the per-document mean
        (as lm-eval aggregates a multiple-choice task's metrics), and so is each of lm-eval's other figures,
        weighted by documents; their bootstrap stderrs are dropped, the gated metric's is recomputed."""
        by_id = dict(zip(self.ids, self.per_doc)) | dict(zip(more.ids, more.per_doc))
        ids = tuple(sorted(by_id))
        per_doc = np.array([by_id[i] for i in ids])
        n, m = len(self.per_doc), len(more.per_doc)
        mine, theirs = (r.results.get("results", {}).get(self.task, {}) for r in (self, more))
        row = {k: (v * n + theirs[k] * m) / (n + m) for k, v in mine.items() if "stderr" not in k
               and isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(theirs.get(k), (int, float))}
        row |= {k: n + m for k in row if k.startswith("sample_len")}      # a count, not a mean
        results = {**self.results, "results": {**self.results.get("results", {}), self.task: row}}
        return self._over(ids, per_doc, results=results, first_look=self.first_look or n)

    def _over(self, ids: tuple, per_doc: np.ndarray, **more) -> "AccuracyReport":
        """This report with `per_doc` (over `ids`) as its documents: value and stderr their mean's."""
        return replace(self, value=float(per_doc.mean()), stderr=mean_stderr(per_doc),
                       per_doc=tuple(per_doc.tolist()), doc_ids=ids, **more)

    def to_metrics(self) -> dict[str, float]:
        """Every numeric figure lm-eval reported for the task (`acc,none` -> `acc`), plus the gated one."""
        row = self.results.get("results", {}).get(self.task, {})
        out = {mlflow_name(f"accuracy/{self.task}/{k.removesuffix(',none')}"): float(v)
               for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        out[mlflow_name(f"accuracy/{self.task}/{self.metric}")] = self.value
        out[mlflow_name(f"accuracy/{self.task}/{self.metric}_stderr")] = self.stderr
        out[mlflow_name(f"accuracy/{self.task}/documents")] = float(len(self.per_doc))
        return out


def mlflow_name(name: str) -> str:
    """lm-eval keys like `acc,none` are not valid MLflow names."""
    return re.sub(r"[^0-9A-Za-z_\-./ ]", "_", name)


def check_tasks(tasks: list[str], include_path: Path | None) -> None:
    """Every task is known to lm-eval or found in the include_path folder (which must exist)."""
    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(f"accuracy.include_path {include_path} is not a folder",
                          "point it at an existing folder of lm-eval task YAMLs, or set it to null")
    if not tasks:
        raise ConfigError("accuracy.tasks is empty", "list at least one task, e.g. accuracy.tasks=[hellaswag]")
    known = task_index(tuple(tasks), include_path).all_tasks
    unknown = [t for t in tasks if t not in known]
    if unknown:
        near = {t: difflib.get_close_matches(t, known, n=1) for t in unknown}
        hints = "; ".join(f"did you mean {near[t][0]!r} for {t!r}" for t in unknown if near[t])
        where = f"lm-eval's own tasks or {include_path}" if include_path else "lm-eval's own tasks"
        raise ConfigError(f"unknown lm-eval task(s): {', '.join(unknown)} (searched {where})",
                          (hints + "; otherwise " if hints else "") + "use a task lm-eval knows, or set "
                          "accuracy.include_path to a folder holding its YAML")


def gated(tasks: list[str], include_path: Path | None, chosen: str | None) -> list[GatedMetric]:
    """The metric each (known) task is gated on: `chosen` (gate.accuracy.metric) or the task's first; refused
    here when a task does not produce it per document."""
    return gated_metrics(list(tasks), task_index(tuple(tasks), include_path).task_index, chosen)


@functools.lru_cache(maxsize=8)
def task_index(tasks: tuple[str, ...], include_path: Path | None):
    """task_manager's, kept for the checks: validate() and the scorer check one sweep's tasks, each index ~10 s."""
    return task_manager(list(tasks), include_path)


def task_manager(tasks: list[str], include_path: Path | None):
    """The include_path folder alone when it holds every task: indexing lm-eval's own ~15,000 tasks takes
    ~10 s on 2 cores, spent only when a task may be one of them (or a local group may name them)."""
    from lm_eval.tasks import TaskManager  # heavy

    if include_path is not None:
        local = TaskManager(include_path=str(include_path), include_defaults=False)
        if set(tasks) <= set(local.all_subtasks):
            return local
    return TaskManager(include_path=str(include_path) if include_path else None)


def mean_stderr(per_doc: np.ndarray) -> float:
    """The standard error of a per-document mean (0 for a single document)."""
    return float(per_doc.std(ddof=1) / np.sqrt(len(per_doc))) if len(per_doc) > 1 else 0.0


def first_look_ids(tasks: list[str], manager, limit: int | None, first_look: int, seed: int) -> dict[str, list[int]]:
    """Per task, `first_look` document ids drawn with `seed` from its first `limit` (all of them if no more)."""
    rng, out = np.random.default_rng(seed), {}
    for task, obj in manager.load(list(tasks))["tasks"].items():
        n = len(obj.eval_docs) if limit is None else min(len(obj.eval_docs), int(limit))
        out[task] = sorted(int(i) for i in rng.choice(n, first_look, replace=False)) if first_look < n else list(range(n))
    return out


def evaluate(lm, tasks: list[str], metric: str | None, include_path: Path | None, limit: int | None,
             seed: int, progress=None, first_look: int | None = None,
             doc_ids: list[int] | None = None) -> list[AccuracyReport]:
    """Each task's first `limit` documents (None: all). With `first_look` below that, a sample of `first_look`
    of them drawn with `seed` is scored now, the rest when the gate asks (doc_ids: those documents only; the
    reports say how many the last look scores). Drawn, not the first ones: a task's documents are often in
    order of subject or source, and an early decision on the first of them would speak for those alone. progress(done, total, what, unit) (console.Stage.progress): requests
    answered of those asked, counted where the LM hands each answer to its cache hook (HFLM and the adapters
    here do, one per request). metric: gate.accuracy.metric (None: each task's first per-document metric)."""
    from lm_eval.evaluator import simple_evaluate  # heavy

    for request_type in ("loglikelihood", "loglikelihood_rolling", "generate_until"):
        # lm-eval calls these without disable_tqdm; a bar per request type would bury the console.
        method = functools.partial(getattr(lm, request_type), disable_tqdm=True)
        setattr(lm, request_type, _counted(lm, method, request_type, progress) if progress else method)
    manager = task_manager(list(tasks), include_path)
    metrics = {g.task: g.metric for g in gated_metrics(list(tasks), manager.task_index, metric)}
    if doc_ids is not None:
        chosen = {"limit": None, "samples": {t: list(doc_ids) for t in tasks}}
    elif first_look is None or (limit is not None and limit <= first_look):
        chosen = {"limit": limit}
    else:
        chosen = {"limit": None, "samples": first_look_ids(tasks, manager, limit, first_look, seed)}
    # bootstrap_iters=0: the stderr comes from the per-document values below (paired later)
    res = simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, **chosen, log_samples=True,
                          random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                          fewshot_random_seed=seed, bootstrap_iters=0)
    reports = []
    for task in tasks:
        row, metric = res["results"][task], metrics[task]
        samples = sorted(res["samples"][task], key=lambda s: s["doc_id"])
        per_doc = np.array([float(s[metric]) for s in samples])
        total = int(res["n-samples"][task]["original"])
        documents = total if limit is None else min(total, int(limit))
        reports.append(AccuracyReport(
            task=task, metric=metric, value=float(row[f"{metric},none"]),
            stderr=mean_stderr(per_doc),
            per_doc=tuple(per_doc.tolist()), doc_ids=tuple(int(s["doc_id"]) for s in samples),
            documents=documents, first_look=len(per_doc) if len(per_doc) < documents else 0,
            # as JSON sees it: task configs hold callables and locks, and a report travels between processes
            results=json.loads(json.dumps({"results": res["results"], "configs": res.get("configs", {}),
                                           "versions": res.get("versions", {})}, default=str))))
    return reports
