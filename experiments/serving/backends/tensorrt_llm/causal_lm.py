"""TensorRT-LLM's `trtllm-serve` for a causal LM, on a CUDA device, in an environment of its own.

`tensorrt-llm==1.2.1` is on PyPI, but the TensorRT wheels it depends on are published on NVIDIA's index only
(pypi.nvidia.com), which these machines cannot reach: where the environment cannot be made, building the engine
is one error saying so (EngineUnavailable), recorded as the rung's reason. Without CUDA it is refused up front.
"""
from __future__ import annotations

from experiments.core.recipe import Candidate
from experiments.serving.backends.served import ServedEngine
from experiments.serving.environments import EngineEnvironment, engines_home

ENVIRONMENT = EngineEnvironment("tensorrt-llm", "1.2.1", "cuda", ("tensorrt-llm==1.2.1",),
                                check="tensorrt_llm.commands.serve")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class TensorRtLlmEngine(ServedEngine):
    name = "tensorrt-llm"
    startup_timeout_s = 1800.0        # it builds its TensorRT engine at start-up

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        r = cand.recipe
        if r.execution_provider != "cuda":
            return "TensorRT-LLM serves on a CUDA device only"
        if r.compile != "none":
            return "torch.compile compiles the torch engine; TensorRT-LLM builds its own engine"
        if r.precision not in DTYPES or r.quantization not in ("none", "fp8"):
            return f"TensorRT-LLM here runs fp32, bf16 or fp16, with fp8 weights at most (not {r.quantization})"
        if r.kv_cache_dtype != "auto" or r.speculative != "none":
            return f"{cls.name}'s KV-cache types and speculative decoding are not wired here yet"
        if r.batching in ("static", "dynamic"):
            return "TensorRT-LLM batches in flight (continuously); its batching rung is continuous_batching"
        return None

    @classmethod
    def batches_continuously(cls, recipe, scheduler: str) -> dict | None:
        return {}

    def server_command(self, cand: Candidate, threads: int) -> tuple[list[str], dict[str, str]]:
        python = ENVIRONMENT.ensure(engines_home())
        r = cand.recipe
        args = [str(python.parent / "trtllm-serve"), str(cand.target.model_dir), "--host", "127.0.0.1",
                "--port", "{port}", "--backend", "pytorch", "--served_model_name", cand.target.name]
        if r.batching == "continuous" and r.max_batch > 1:
            args += ["--max_batch_size", str(r.max_batch)]
        if r.tensor_parallel > 1:
            args += ["--tp_size", str(r.tensor_parallel)]
        if r.pipeline_parallel > 1:
            args += ["--pp_size", str(r.pipeline_parallel)]
        devices = range(r.cuda_device, r.cuda_device + r.devices_per_replica)
        return args, {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))}

    def described(self) -> dict[str, str]:
        return {**super().described(), "version": ENVIRONMENT.version, "environment": str(ENVIRONMENT.folder()),
                "requirements": " ".join(ENVIRONMENT.requirements)}

    def weight_bits(self) -> float:
        return 8.0 if self.recipe.quantization == "fp8" else {"fp32": 32.0}.get(self.recipe.precision, 16.0)
