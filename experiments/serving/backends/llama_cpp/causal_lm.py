"""llama.cpp's `llama-server` for a causal LM: the target's weights converted to GGUF (and quantized by llama.cpp
itself), served by the native server built here (build.py).

The recipe maps onto llama.cpp's own settings: precision -> the GGUF's type (F32, BF16, F16); quantization int8 ->
Q8_0, int4 -> Q4_K_M, or the weight_format named (Q4_0, IQ4_NL: types whose blocks its CPU backend repacks at
load for AVX2 / AVX-512 kernels), made from the user's own weights by llama-quantize; continuous batching's max_batch ->
--parallel (slots), its max_tokens_per_step -> --batch-size and --ubatch-size (tokens one decode call carries;
0: llama.cpp's defaults); prefix_caching -> its prompt cache and its host-memory copies of past prompts
(--cache-ram, capped at its default 8 GiB), on as llama-server starts and as the swap enters (the load sends no
prompt twice unless the workload repeats, so the cache cannot flatter it); off: --no-cache-prompt --cache-ram 0.
recipe.threads -> --threads (decoding), with --threads-batch keeping the sweep's `threads` for prompts;
speculative draft -> --spec-type draft-simple --model-draft (the draft's GGUF, or a Q8_0 made from its folder).

llama-server returns no prompt log-probs (it ignores `echo`), so each position is scored by asking for one token
with that position's real next token forced by a logit bias: the probabilities it reports come from the raw
logits, before any sampler, so the forced token's is its exact probability under the model, with the top K
beside it; the prompt cache makes each such request one decode step. lm-eval's loglikelihood requests are scored
the same way (ForcedTokenLM): the kernels that serve are the kernels that score.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from experiments.core.artefacts import cached, model_identity
from experiments.core.recipe import Candidate
from experiments.judge.accuracy import TokenizedLM
from experiments.judge.fidelity import TopLogprobs
from experiments.serving.backends.llama_cpp.build import (CMAKE_FLAGS, LlamaCppBuild, beyond_embedding_refusal,
                                                          gguf_of)
from experiments.serving.backends.served import ServedEngine
from experiments.serving.environments import Step, engines_home
from experiments.serving.server_metrics import LLAMA_CPP

GGUF_TYPES = {("fp32", "none"): "f32", ("bf16", "none"): "bf16", ("fp16", "none"): "f16"}
QUANTIZED = {"int8": "Q8_0", "int4": "Q4_K_M"}
# int4 weight formats beside Q4_K_M, and bits per weight of each type (a block's scales included)
FORMATS = {"Q4_0": "int4", "IQ4_NL": "int4"}
BITS = {"f32": 32.0, "bf16": 16.0, "f16": 16.0, "Q8_0": 8.5, "Q4_K_M": 4.5, "Q4_0": 4.5, "IQ4_NL": 4.5}
FORCE = 1000.0              # a logit bias no other token overcomes
MAX_CONTEXT = 2048          # tokens per slot: the workload's prompts and outputs fit well within it
CACHE_RAM_MIB = 8192        # llama-server's --cache-ram default: the cap of its host-memory prompt cache


def gguf_type(recipe) -> str | None:
    if recipe.weight_format:
        return recipe.weight_format if FORMATS.get(recipe.weight_format) == recipe.quantization else None
    if recipe.quantization in QUANTIZED:
        return QUANTIZED[recipe.quantization]
    return GGUF_TYPES.get((recipe.precision, recipe.quantization))


class LlamaCppEngine(ServedEngine):
    name = "llama.cpp"
    metric_names = LLAMA_CPP
    caches_prefixes_by_default = True   # cache_prompt, and --cache-ram's host-memory copies of past prompts
    weight_formats = tuple(FORMATS)
    draft: Path | None = None           # the draft model's GGUF, when it decodes speculatively with one

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        r = cand.recipe
        if r.execution_provider == "cuda":
            return "llama.cpp is built here for the CPU (GGML_NATIVE); a CUDA build is not made"
        if r.compile != "none" or r.cuda_graph:
            return "torch.compile and CUDA graphs are the torch engine's; llama.cpp runs its own kernels"
        if gguf_type(r) is None:
            return (f"no GGUF type for precision {r.precision} with quantization {r.quantization}"
                    f"{' as ' + r.weight_format if r.weight_format else ''} (llama.cpp here: fp32, bf16, fp16, or "
                    f"int8 -> Q8_0 and int4 -> {' / '.join((QUANTIZED['int4'], *FORMATS))} from fp32 weights)")
        if r.batching in ("static", "dynamic"):
            return "llama-server batches continuously over its slots; its batching rung is server_batching"
        if r.kv_cache_dtype not in ("auto", "int8"):
            return f"llama.cpp's KV cache here is the model's precision or int8 (q8_0), not {r.kv_cache_dtype}"
        if r.speculative not in ("none", "ngram", "draft"):
            return f"llama-server's speculative decoding here is n-gram lookup or a draft model, not {r.speculative}"
        if r.speculative == "draft" and not Path(r.draft_model).exists():
            return f"the draft model {r.draft_model or '(none named)'} does not exist"
        if r.devices_per_replica > 1:
            return "llama.cpp here serves on one CPU: no tensor or pipeline parallelism"
        return LlamaCppBuild().unbuildable() or beyond_embedding_refusal(cand.target.model_dir)

    @classmethod
    def batches_continuously(cls, recipe, scheduler: str) -> dict | None:
        return {}        # its own slots: the rung's max_batch becomes --parallel

    def server_command(self, cand: Candidate, threads: int) -> tuple[list[str], dict[str, str]]:
        build = LlamaCppBuild().ensure(engines_home())
        self.gguf, self.reused = self._gguf(build, Path(cand.target.model_dir), gguf_type(cand.recipe),
                                            cand.target.name)
        self.draft = self._draft(build, Path(cand.recipe.draft_model)) if cand.recipe.speculative == "draft" else None
        return command(cand, build / "bin" / "llama-server", self.gguf, threads, self.context_length(),
                       self.draft), {}

    def _gguf(self, build: Path, model_dir: Path, kind: str, name: str) -> tuple[Path, bool]:
        """(the `kind` GGUF of the weights in `model_dir`, made once; whether it was reused)."""
        key = {"source": model_identity(model_dir), "type": kind, "llama.cpp": LlamaCppBuild().version}

        def make(tmp: Path) -> None:
            log_path = tmp / "convert.log"
            with open(log_path, "w") as log:
                gguf_of(build, model_dir, tmp / "model.gguf", kind, Step(log, log_path, f"the {kind} GGUF of {name}"))

        folder, reused = cached(self.artefact_root, f"gguf-{kind.lower()}", key, make)
        return folder / "model.gguf", reused

    def _draft(self, build: Path, draft: Path) -> Path:
        """The draft model as llama-server loads it: a GGUF as given, a folder as a Q8_0 made from it."""
        return draft if draft.is_file() else self._gguf(build, draft, QUANTIZED["int8"], f"draft {draft.name}")[0]

    def described(self) -> dict[str, str]:
        build = LlamaCppBuild()
        return {**super().described(), "version": build.version, "environment": str(build.folder()),
                "requirements": f"{build.source} (vendored llama.cpp, built with {' '.join(CMAKE_FLAGS)})",
                "gguf": str(self.gguf), **({"draft": str(self.draft)} if self.draft else {})}

    def artefact_paths(self) -> list[Path]:
        return [self.gguf, *([self.draft] if self.draft else [])]

    def bounded_cache_mb(self) -> float | None:
        return float(CACHE_RAM_MIB) if self.recipe.prefix_caching else None

    def weight_bits(self) -> float:
        return BITS[gguf_type(self.recipe)]

    # --- what the server answers ------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], max_new_tokens: int):
        began = time.perf_counter()
        body = self._native(prompt_ids, n_predict=max_new_tokens, ignore_eos=True, return_tokens=True)
        tokens = [int(t) for t in body["tokens"]]
        if len(tokens) != max_new_tokens:
            raise RuntimeError(f"llama-server returned {len(tokens)} tokens of the {max_new_tokens} asked for")
        per_token = (time.perf_counter() - began) / max(1, len(tokens))
        for token in tokens:
            yield token, per_token

    def next_token(self, prefix: list[int], forced: int | None, top_k: int) -> tuple[list[tuple[int, float]], float]:
        """(the top K (token, log-prob) after `prefix`, most likely first; log p(forced), or nan)."""
        bias = [[forced, FORCE]] if forced is not None else []
        body = self._native(prefix, n_predict=1, n_probs=top_k, logit_bias=bias, cache_prompt=True,
                            return_tokens=True)
        (step,) = body["completion_probabilities"]
        top = [(int(p["id"]), float(p["logprob"])) for p in step["top_logprobs"]]
        if forced is not None and int(step["id"]) != forced:
            raise RuntimeError(f"llama-server did not take the forced token {forced} (it chose {step['id']})")
        return top, float(step["logprob"]) if forced is not None else float("nan")

    def lm_eval_model(self, batch_size: int):
        lm = ForcedTokenLM(self)
        lm._logprobs = ForcedLogprobs(self, self.top_k)
        return lm

    def _native(self, prompt_ids: list[int], **fields) -> dict:
        return self._post("/completion", {"prompt": [int(t) for t in prompt_ids], "temperature": 0.0, **fields})


def command(cand: Candidate, server: Path, gguf: Path, threads: int, model_context: int,
            draft: Path | None = None) -> list[str]:
    r = cand.recipe
    if r.defaults:
        # as a user starts it: the model and where to listen; --metrics only opens /metrics (what the load
        # ladder reads requests in flight from), and --alias names the model in its answers
        return [str(server), "-m", str(gguf), "--alias", cand.target.name, "--host", "127.0.0.1", "--port", "{port}",
                "--metrics"]
    slots = r.max_batch if r.batching == "continuous" else 1
    context = min(model_context, MAX_CONTEXT)
    args = [str(server), "-m", str(gguf), "--alias", cand.target.name, "--host", "127.0.0.1", "--port", "{port}",
            "--parallel", str(slots), "-c", str(context * slots), "--threads",
            str(LlamaCppEngine.compute_threads(r, threads)), "--metrics", "--no-webui"]
    if r.threads:
        # the threads it decodes with; prompts (compute-bound) still take all of them
        args += ["--threads-batch", str(threads)]
    if r.batching == "continuous" and r.max_tokens_per_step > 0:
        # the physical batch (ubatch) cannot exceed the logical one
        args += ["--batch-size", str(r.max_tokens_per_step), "--ubatch-size", str(r.max_tokens_per_step)]
    # with prefix caching (as deployed), the host-memory prompt cache at its cap, stated: the soak judges its
    # growth against the cap (bounded_cache_mb)
    args += (["--cache-prompt", "--cache-ram", str(CACHE_RAM_MIB)] if r.prefix_caching
             else ["--no-cache-prompt", "--cache-ram", "0"])
    if r.kv_cache_dtype == "int8":
        # a quantized V cache needs flash attention
        args += ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--flash-attn", "on"]
    if r.speculative == "ngram":
        args += ["--spec-type", "ngram-simple"]
    if r.speculative == "draft":
        # the draft model proposes tokens (as many as llama.cpp's default), the model verifies them in one step
        args += ["--spec-type", "draft-simple", "--model-draft", str(draft)]
    return args


class ForcedLogprobs:
    """token ids -> TopLogprobs (fidelity), one forced-token request per position (see the module's docstring)."""

    def __init__(self, engine: LlamaCppEngine, top_k: int):
        self.engine, self.top_k = engine, top_k

    def __call__(self, tokens) -> TopLogprobs:
        tokens = [int(t) for t in tokens]
        ids, lps, followed = [], [], []
        for t in range(len(tokens)):
            nxt = tokens[t + 1] if t + 1 < len(tokens) else None
            top, forced = self.engine.next_token(tokens[:t + 1], nxt, self.top_k)
            ids.append([i for i, _ in top])
            lps.append([lp for _, lp in top])
            followed.append(forced)
        return TopLogprobs(np.array(ids), np.array(lps), np.array(followed), np.array(tokens[1:] + [-1]),
                           "llama-server's top-{k} log-probs, each position's next token forced")


class ForcedTokenLM(TokenizedLM):
    """lm-eval's loglikelihood through llama-server: each continuation token's log-prob read with it forced."""

    def __init__(self, engine: LlamaCppEngine):
        super().__init__()
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.max_length = min(engine.context_length(), MAX_CONTEXT) - 1

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        results = []
        for key, context_enc, continuation_enc in requests:
            whole = (context_enc + continuation_enc)[-(self.max_length + 1):]
            start = len(whole) - len(continuation_enc)
            total, greedy = 0.0, True
            for j in range(start, len(whole)):
                top, forced = self.engine.next_token(whole[:j], whole[j], 1)
                total += forced
                greedy = greedy and top[0][0] == whole[j]
            results.append((total, greedy))
            self.cache_hook.add_partial("loglikelihood", key, results[-1])
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("rolling loglikelihood (perplexity tasks) through llama-server is not built")

    def generate_until(self, requests, disable_tqdm: bool = False):
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            until = gen_kwargs.get("until", [])
            body = self.engine._native(self.tok_encode(context)[-self.max_length:],
                                       n_predict=int(gen_kwargs.get("max_gen_toks", 64)), stop=list(until))
            text = body["content"]
            for u in until:
                text = text.split(u)[0]
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out
