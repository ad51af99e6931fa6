"""SGLang's OpenAI-compatible server for a causal LM, on a CUDA device, in SGLang's own environment.

SGLang has no CPU build on PyPI: on a machine without CUDA the engine refuses with that reason, so a rung that
would produce it is skipped saying why. Its server speaks vLLM's completion protocol (token-id prompts,
`ignore_eos`, `return_tokens_as_token_ids`, prompt log-probs), so measuring and scoring are the served engine's.
"""
from __future__ import annotations

from experiments.core.recipe import Candidate
from experiments.serving.backends.served import ServedEngine
from experiments.serving.environments import EngineEnvironment, engines_home
from experiments.serving.server_metrics import MetricNames

ENVIRONMENT = EngineEnvironment("sglang", "0.5.23", "cuda", ("sglang==0.5.23",), check="sglang.launch_server")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# --enable-metrics: its Prometheus names
SGLANG = MetricNames("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")


class SglangEngine(ServedEngine):
    name = "sglang"
    metric_names = SGLANG

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        r = cand.recipe
        if r.execution_provider != "cuda":
            return "SGLang serves on a CUDA device; its PyPI build has no CPU backend"
        if r.compile != "none":
            return "torch.compile compiles the torch engine; SGLang compiles its own graphs"
        if r.precision not in DTYPES or r.quantization not in ("none", "fp8"):
            return f"SGLang here runs fp32, bf16 or fp16, with fp8 weights at most (not {r.quantization})"
        if r.kv_cache_dtype != "auto" or r.speculative != "none":
            return f"{cls.name}'s KV-cache types and speculative decoding are not wired here yet"
        if r.batching in ("static", "dynamic"):
            return "SGLang batches continuously; its batching rung is continuous_batching"
        return None

    @classmethod
    def batches_continuously(cls, recipe, scheduler: str) -> dict | None:
        return {}

    def server_command(self, cand: Candidate, threads: int) -> tuple[list[str], dict[str, str]]:
        python = ENVIRONMENT.ensure(engines_home())
        r = cand.recipe
        args = [str(python), "-m", "sglang.launch_server", "--model-path", str(cand.target.model_dir),
                "--served-model-name", cand.target.name, "--host", "127.0.0.1", "--port", "{port}",
                "--dtype", DTYPES[r.precision], "--enable-metrics"]
        if r.batching == "continuous" and r.max_batch > 1:
            args += ["--max-running-requests", str(r.max_batch)]
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
        devices = range(r.cuda_device, r.cuda_device + r.devices_per_replica)
        return args, {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))}

    def described(self) -> dict[str, str]:
        return {**super().described(), "version": ENVIRONMENT.version, "environment": str(ENVIRONMENT.folder()),
                "requirements": " ".join(ENVIRONMENT.requirements)}

    def weight_bits(self) -> float:
        return 8.0 if self.recipe.quantization == "fp8" else {"fp32": 32.0}.get(self.recipe.precision, 16.0)
