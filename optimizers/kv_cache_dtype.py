"""KV-cache type: the serving engine stores its KV cache in fewer bits (llama.cpp q8_0 on CPU; vLLM fp8 on a GPU),
so more sequences fit and each decode step reads less. The model's weights are unchanged."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import fixed_kv_budget, refusal
from optimizers.base import Optimizer

TYPES = ("int8", "fp8")


class KvCacheDtype(Optimizer):
    name = "kv_cache_dtype"
    cost = "zero"

    def __init__(self, cpu_dtype: str = "int8", cuda_dtype: str = "fp8"):
        if cpu_dtype not in TYPES or cuda_dtype not in TYPES:
            raise ValueError(f"cpu_dtype and cuda_dtype must be one of {TYPES}, got {cpu_dtype!r}, {cuda_dtype!r}")
        self.cpu_dtype, self.cuda_dtype = cpu_dtype, cuda_dtype

    def check(self, env: Env, cand: Candidate) -> str | None:
        if cand.recipe.kv_cache_dtype != "auto":
            return f"the champion's KV cache is already {cand.recipe.kv_cache_dtype}"
        return refusal(self.apply(cand))

    def aim_for(self, cand: Candidate) -> str:
        # an engine whose KV pool has a fixed budget (vLLM) saves no memory with fewer bits: it fits more
        # sequences, which only speed under load can show
        return "speed" if fixed_kv_budget(cand) else self.aim

    def apply(self, cand: Candidate) -> Candidate:
        dtype = self.cuda_dtype if cand.recipe.execution_provider == "cuda" else self.cpu_dtype
        return cand.edited(self.name, kv_cache_dtype=dtype)
