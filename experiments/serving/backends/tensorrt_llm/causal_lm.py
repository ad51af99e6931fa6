"""TensorRT-LLM's `trtllm-serve` for a causal LM, on a CUDA device, in an environment of its own.

`tensorrt-llm==1.2.1` is on PyPI, but the TensorRT wheels it depends on are published on NVIDIA's index only
(pypi.nvidia.com), which these machines cannot reach: where the environment cannot be made, building the engine
is one error saying so (EngineUnavailable), recorded as the rung's reason. Without CUDA it is refused up front.
"""
from __future__ import annotations

from experiments.core.recipe import Candidate
from experiments.serving.backends.served import ServedEngine, cuda_devices, cuda_server_refusal
from experiments.serving.environments import EngineEnvironment, engines_home

ENVIRONMENT = EngineEnvironment("tensorrt-llm", "1.2.1", "cuda", ("tensorrt-llm==1.2.1",),
                                check="tensorrt_llm.commands.serve")


class TensorRtLlmEngine(ServedEngine):
    name = "tensorrt-llm"
    startup_timeout_s = 1800.0        # it builds its TensorRT engine at start-up
    fixed_kv_budget = True            # its KV pool is a share of free GPU memory (kv_cache_free_gpu_memory_fraction)

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        return cuda_server_refusal("TensorRT-LLM", cand.recipe)

    @classmethod
    def batches_continuously(cls, recipe, scheduler: str) -> dict | None:
        return {}

    def server_command(self, cand: Candidate, threads: int) -> tuple[list[str], dict[str, str]]:
        python = self.environment().ensure(engines_home())
        r = cand.recipe
        args = [str(python.parent / "trtllm-serve"), str(cand.target.model_dir), "--host", "127.0.0.1",
                "--port", "{port}", "--backend", "pytorch", "--served_model_name", cand.target.name]
        if r.batching == "continuous":
            args += ["--max_batch_size", str(r.max_batch)]
        if r.batching == "continuous" and r.max_tokens_per_step > 0:
            args += ["--max_num_tokens", str(r.max_tokens_per_step)]
        if r.tensor_parallel > 1:
            args += ["--tp_size", str(r.tensor_parallel)]
        if r.pipeline_parallel > 1:
            args += ["--pp_size", str(r.pipeline_parallel)]
        return args, cuda_devices(r)

    def environment(self) -> EngineEnvironment:
        return ENVIRONMENT
