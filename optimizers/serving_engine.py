"""Engine swap to a serving engine (vLLM, llama.cpp's llama-server): the server people deploy, started for the
candidate, with its own continuous batching, at the champion's precision.

It enters at a setting sized to the load the sweep serves, not one picked blindly (issue 41: llama.cpp entering
with 8 slots served a load of 4 at 89 tokens/s where 4 slots served 122, and the ladder discarded it for that):
an engine that allocates each sequence's KV cache at start-up (llama.cpp's slots) gets as many as the load has
in flight at its peak; one whose KV pool is a fixed budget whatever the batch (vLLM, SGLang, TensorRT-LLM) keeps
`max_num_seqs` unless the load exceeds it. Without a measured load (the baseline's bench), `max_num_seqs`.
Its prompt or prefix cache is as its users start it (on for llama.cpp, vLLM and SGLang): the load never sends a
server a prompt twice unless the workload repeats (experiments/targets/workload.py), so the cache buys only what
the traffic lets it.
"""
from dataclasses import replace

from experiments.core.recipe import Candidate, Env
from experiments.core.reports import peak_in_flight
from experiments.serving import engine_class, refusal
from experiments.serving.backends.llama_cpp.build import LlamaCppBuild
from optimizers.base import SERVING_ENGINES, Optimizer


class ServingEngineSwap(Optimizer):
    cost = "zero"

    def __init__(self, engine: str, max_num_seqs: int = 16, max_num_batched_tokens: int = 0,
                 tensor_parallel: int = 1, pipeline_parallel: int = 1, size_to_load: bool = True):
        """max_num_seqs: requests the server runs at once (its continuous batch) where the load does not size it;
        max_num_batched_tokens: prefill + decode tokens per step (0: the engine's default); tensor_parallel x
        pipeline_parallel: the devices one replica spans (the capacity plan counts them); size_to_load: size the
        batch to the champion's measured load (see the module's docstring)."""
        if tensor_parallel < 1 or pipeline_parallel < 1:
            raise ValueError(f"tensor_parallel and pipeline_parallel must be >= 1 (got {tensor_parallel}, "
                             f"{pipeline_parallel})")
        self.tensor_parallel, self.pipeline_parallel = tensor_parallel, pipeline_parallel
        if engine not in SERVING_ENGINES:
            raise ValueError(f"engine must be one of {SERVING_ENGINES}, got {engine!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < 0:
            raise ValueError(f"max_num_seqs must be >= 1 and max_num_batched_tokens >= 0 (got {max_num_seqs}, "
                             f"{max_num_batched_tokens})")
        self.engine = engine
        self.name = engine.replace(".", "_").replace("-", "_")   # llama.cpp -> llama_cpp: a rung's name is a key
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.size_to_load = size_to_load
        self.peak: int | None = None        # the champion's load at its peak, as `observe` found it
        self.peak_from = "no load was measured"

    def observe(self, champion) -> None:
        bench = getattr(champion, "bench", None)
        self.peak, self.peak_from = peak_in_flight(bench) if bench is not None else (None, "no load was measured")

    def machine_check(self, env: Env) -> str | None:
        # tensor parallelism needs its devices on this node; pipeline stages may live on others (Ray)
        if self.tensor_parallel > 1 and (env.cuda_device_count or 0) < self.tensor_parallel:
            return (f"tensor_parallel={self.tensor_parallel} needs {self.tensor_parallel} CUDA devices on this "
                    f"node; it has {env.cuda_device_count or 0}")
        if self.engine == "llama.cpp":
            return LlamaCppBuild().unbuildable()
        return None

    def check(self, env: Env, cand: Candidate) -> str | None:
        if reason := self.machine_check(env):
            return reason
        recipe = cand.recipe
        if recipe.engine == self.engine:
            return f"the champion already runs in {self.engine}"
        served, cannot = self._entered(cand)
        if reason := refusal(served):
            return reason
        self.decision = self._why(served) + (f"; {cannot}: it enters with the unquantized weights at "
                                             f"{served.recipe.precision}" if cannot else "")
        return None

    def sequences(self, served: Candidate) -> int:
        """The batch `served` (this rung's candidate, before sizing) enters with."""
        if not self.size_to_load or self.peak is None:
            return self.max_num_seqs
        return max(self.max_num_seqs, self.peak) if _engine_says(served, "fixed_kv_budget") else self.peak

    def _why(self, served: Candidate) -> str:
        seqs = served.recipe.max_batch
        if not self.size_to_load:
            return f"{self.engine} enters with {seqs} requests at once (size_to_load=false)"
        if self.peak is None:
            return f"{self.engine} enters with {seqs} requests at once: {self.peak_from} to size it to"
        load = f"the load peaks at {self.peak} requests in flight ({self.peak_from})"
        if _engine_says(served, "fixed_kv_budget"):
            kept = "keeps its" if seqs == self.max_num_seqs else "grows its"
            return f"{load}: {self.engine}, whose KV pool is a fixed budget, {kept} batch of {seqs}"
        return f"{load}: {self.engine} enters with {seqs} slots, each with its own KV cache"

    def apply(self, cand: Candidate) -> Candidate:
        return self._entered(cand)[0]

    def _entered(self, cand: Candidate) -> tuple[Candidate, str | None]:
        """(this rung's candidate; why it enters with the weights unquantized, or None). Torch-only settings do
        not carry over; the server schedules its own continuous batch, its caches as deployed. Precision and
        quantization do: llama.cpp makes Q8_0 / Q4_K_M from the target's weights for an int8 / int4 champion; an
        engine that cannot serve the champion's quantization but can serve its weights unquantized (vLLM's CPU
        build after a llama.cpp Q8_0 champion) gets them so, and says why; any other refusal is the engine's."""
        served = cand.edited(self.name, engine=self.engine, compile="none", cuda_graph=False, batching="continuous",
                             max_batch=self.max_num_seqs, max_tokens_per_step=self.max_num_batched_tokens,
                             tensor_parallel=self.tensor_parallel, pipeline_parallel=self.pipeline_parallel)
        served = replace(served, recipe=replace(served.recipe, max_batch=self.sequences(served),
                                                prefix_caching=_engine_says(served, "caches_prefixes_by_default")))
        cannot = refusal(served) if served.recipe.quantization != "none" else None
        plain = replace(served, recipe=replace(served.recipe, quantization="none"))
        if cannot and refusal(plain) is None:
            return plain, cannot
        return served, None


def _engine_says(served: Candidate, attribute: str) -> bool:
    """A class attribute of the engine that builds `served` (ServedEngine.fixed_kv_budget,
    caches_prefixes_by_default); False where no engine builds it, which refusal() then says."""
    try:
        return bool(getattr(engine_class(served), attribute, False))
    except ValueError:
        return False
