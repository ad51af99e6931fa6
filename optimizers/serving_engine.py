"""Engine swap to a serving engine (vLLM, llama.cpp's llama-server): the server people deploy, started for the
candidate, with its own continuous batching, at the champion's precision."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer

SERVING_ENGINES = ("vllm", "llama.cpp", "sglang", "tensorrt-llm")


class ServingEngineSwap(Optimizer):
    cost = "zero"

    def __init__(self, engine: str, max_num_seqs: int = 16, max_num_batched_tokens: int = 0):
        """max_num_seqs: requests the server runs at once (its continuous batch); max_num_batched_tokens:
        prefill + decode tokens per step (0: the engine's default)."""
        if engine not in SERVING_ENGINES:
            raise ValueError(f"engine must be one of {SERVING_ENGINES}, got {engine!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < 0:
            raise ValueError(f"max_num_seqs must be >= 1 and max_num_batched_tokens >= 0 (got {max_num_seqs}, "
                             f"{max_num_batched_tokens})")
        self.engine = engine
        self.name = engine.replace(".", "_").replace("-", "_")   # llama.cpp -> llama_cpp: a rung's name is a key
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens

    def check(self, env: Env, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if recipe.engine == self.engine:
            return f"the champion already runs in {self.engine}"
        if recipe.quantization != "none":
            return (f"the champion's weights are {recipe.quantization} in {recipe.engine}; the swap serves the "
                    f"target's own weights (quantization comes after the engine swap)")
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        # torch-only settings do not carry over; the server schedules its own continuous batch.
        return cand.edited(self.name, engine=self.engine, compile="none", cuda_graph=False, batching="continuous",
                           max_batch=self.max_num_seqs, max_tokens_per_step=self.max_num_batched_tokens,
                           prefix_caching=False)
