"""SGLang's OpenAI-compatible server for a causal LM, on a CUDA device, in SGLang's own environment.

SGLang has no CPU build on PyPI: on a machine without CUDA the engine refuses with that reason, so a rung that
would produce it is skipped saying why. Its server speaks vLLM's completion protocol (token-id prompts,
`ignore_eos`, `return_tokens_as_token_ids`, prompt log-probs), so measuring and scoring are the served engine's.
"""
from __future__ import annotations

from experiments.core.recipe import Candidate
from experiments.serving.backends.served import ServedEngine, cuda_devices, cuda_server_refusal
from experiments.serving.environments import EngineEnvironment, engines_home
from experiments.serving.server_metrics import MetricNames

ENVIRONMENT = EngineEnvironment("sglang", "0.5.23", "cuda", ("sglang==0.5.23",), check="sglang.launch_server")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# --enable-metrics: its Prometheus names
SGLANG = MetricNames("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")


class SglangEngine(ServedEngine):
    name = "sglang"
    metric_names = SGLANG
    caches_prefixes_by_default = True   # its radix cache
    fixed_kv_budget = True       # its KV pool is a share of GPU memory (mem_fraction_static)

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        return cuda_server_refusal("SGLang", cand.recipe)

    @classmethod
    def batches_continuously(cls, recipe, scheduler: str) -> dict | None:
        return {}

    def server_command(self, cand: Candidate, threads: int) -> tuple[list[str], dict[str, str]]:
        python = self.environment().ensure(engines_home())
        r = cand.recipe
        args = [str(python), "-m", "sglang.launch_server", "--model-path", str(cand.target.model_dir),
                "--served-model-name", cand.target.name, "--host", "127.0.0.1", "--port", "{port}",
                "--dtype", DTYPES[r.precision], "--enable-metrics"]
        if r.batching == "continuous":
            args += ["--max-running-requests", str(r.max_batch)]
        if r.batching == "continuous" and r.max_tokens_per_step > 0:
            args += ["--chunked-prefill-size", str(r.max_tokens_per_step)]   # prefill tokens one step carries
        if not r.prefix_caching:
            args.append("--disable-radix-cache")      # its prefix cache is on by default
        if not r.cuda_graph:
            args.append("--disable-cuda-graph")
        if r.quantization == "fp8":
            args += ["--quantization", "fp8"]
        if r.tensor_parallel > 1:
            args += ["--tp-size", str(r.tensor_parallel)]
        if r.pipeline_parallel > 1:
            args += ["--pp-size", str(r.pipeline_parallel)]
        return args, cuda_devices(r)

    def environment(self) -> EngineEnvironment:
        return ENVIRONMENT
