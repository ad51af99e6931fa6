"""Engine swap to a serving engine (vLLM, llama.cpp's llama-server): the server people deploy, started for the
candidate, with its own continuous batching, at the champion's precision."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer

SERVING_ENGINES = ("vllm", "llama.cpp", "sglang", "tensorrt-llm")


class ServingEngineSwap(Optimizer):
    cost = "zero"

    def __init__(self, engine: str, max_num_seqs: int = 16, max_num_batched_tokens: int = 0,
                 tensor_parallel: int = 1, pipeline_parallel: int = 1):
        """max_num_seqs: requests the server runs at once (its continuous batch); max_num_batched_tokens:
        prefill + decode tokens per step (0: the engine's default); tensor_parallel x pipeline_parallel: the
        devices one replica spans (the capacity plan counts them)."""
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

    def machine_check(self, env: Env) -> str | None:
        # tensor parallelism needs its devices on this node; pipeline stages may live on others (Ray)
        if self.tensor_parallel > 1 and (env.cuda_device_count or 0) < self.tensor_parallel:
            return (f"tensor_parallel={self.tensor_parallel} needs {self.tensor_parallel} CUDA devices on this "
                    f"node; it has {env.cuda_device_count or 0}")
        return None

    def check(self, env: Env, cand: Candidate) -> str | None:
        if reason := self.machine_check(env):
            return reason
        recipe = cand.recipe
        if recipe.engine == self.engine:
            return f"the champion already runs in {self.engine}"
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        # torch-only settings do not carry over; the server schedules its own continuous batch. Precision and
        # quantization do: llama.cpp makes Q8_0 / Q4_K_M from the target's weights for an int8 / int4 champion,
        # an engine that cannot quantize so says why.
        return cand.edited(self.name, engine=self.engine, compile="none", cuda_graph=False, batching="continuous",
                           max_batch=self.max_num_seqs, max_tokens_per_step=self.max_num_batched_tokens,
                           prefix_caching=False, tensor_parallel=self.tensor_parallel,
                           pipeline_parallel=self.pipeline_parallel)
