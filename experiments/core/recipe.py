"""The data that rungs edit and engines build: the target, its recipe, a candidate, the machine.

A Candidate is a recipe (engine, precision, quantization, ...) for a target that an engine builds. Rungs
(optimizers/) produce candidates, engines (experiments/serving) build them, the sweep records them: this module
imports none of them.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Target:
    name: str
    kind: str            # a target kind's name (experiments/targets/kinds): causal-lm | embedding
    model_dir: Path      # a Hugging Face folder (config, safetensors, tokenizer)


@dataclass(frozen=True)
class Recipe:
    engine: str = "torch"            # torch | onnxruntime | openvino (encoders)
    precision: str = "fp32"          # fp32 | bf16 | fp16
    quantization: str = "none"       # none | int8 | int4 | fp8 (weights of the decoder layers)
    execution_provider: str = "cpu"  # cpu | cuda (the device, for either engine; set from target.device)
    cuda_device: int = 0             # which CUDA device (torch's index) when execution_provider is cuda
    compile: str = "none"            # torch: none | inductor
    cuda_graph: bool = False         # capture the decode step as a CUDA graph (torch: reduce-overhead)
    batching: str = "none"           # none (one request at a time) | static | dynamic | continuous
    max_batch: int = 1
    max_wait_ms: float = 0.0         # static: wait for a full batch this long at most; dynamic: the window
    kv_block_size: int = 0           # continuous (paged KV cache): tokens per block
    kv_num_blocks: int = 0           # continuous: blocks in the pool
    max_tokens_per_step: int = 0     # continuous: prefill + decode tokens one step may carry
    prefix_caching: bool = False     # continuous: full KV blocks of a shared prompt prefix are reused
    # continuous batching over the torch model: transformers (its paged-KV manager) | own (iteration-level
    # scheduler over a left-padded batched KV cache, experiments/serving/iteration.py). Runs logged before
    # this field ran transformers', hence the default.
    scheduler: str = "transformers"
    # Serving engines only (vLLM, llama.cpp, SGLang, TensorRT-LLM); each engine says which values it takes.
    kv_cache_dtype: str = "auto"     # auto (the model's precision) | int8 | fp8: the KV cache's stored type
    # none | ngram (tokens drafted from the prompt) | draft (by a draft model), verified in one step
    speculative: str = "none"
    draft_model: str = ""            # speculative draft: the draft model (a GGUF file or a Hugging Face folder)
    tensor_parallel: int = 1         # devices one replica's layers are split across
    pipeline_parallel: int = 1       # stages one replica's layers are cut into (vLLM: Ray beyond one node)
    # Serving engines: the weights' storage format where one quantization has several (llama.cpp int4: Q4_K_M,
    # or Q4_0 / IQ4_NL, which its CPU backend repacks into interleaved blocks at load); "": the engine's usual.
    weight_format: str = ""
    # The engine's compute threads: 0, the sweep's `threads`; below 0, that many cores of them kept for the rest
    # of the serving process (its HTTP thread, tokenizer, scheduler); above 0, that many (Engine.compute_threads).
    threads: int = 0
    # Serving engines: started as their users start them, with the model and no other setting (the reference a
    # sweep must beat); the other fields then say what those defaults are. Any rung's edit clears it.
    defaults: bool = False

    @property
    def devices_per_replica(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


@dataclass(frozen=True)
class Candidate:
    target: Target
    recipe: Recipe = field(default_factory=Recipe)
    rungs: tuple[str, ...] = ()

    def edited(self, rung: str, **changes) -> "Candidate":
        """This candidate with `rung`'s changes; an engine's defaults changed are no longer its defaults."""
        return Candidate(self.target, replace(self.recipe, **{"defaults": False, **changes}), self.rungs + (rung,))

    def describe(self) -> dict:
        return {"rungs": list(self.rungs), **asdict(self.recipe)}


@dataclass(frozen=True)
class Env:
    """What the machine offers; rungs consult it in `check`."""
    cuda: bool
    cuda_capability: tuple[int, int] | None
    cpu_count: int
    cuda_device_count: int | None = None   # None: as many as `cuda` implies (one, or none)

    def __post_init__(self):
        if self.cuda_device_count is None:
            object.__setattr__(self, "cuda_device_count", 1 if self.cuda else 0)

    @classmethod
    def detect(cls) -> "Env":
        import torch  # heavy

        cuda = torch.cuda.is_available()
        return cls(cuda=cuda, cuda_capability=torch.cuda.get_device_capability() if cuda else None,
                   cpu_count=os.cpu_count() or 1, cuda_device_count=torch.cuda.device_count() if cuda else 0)


def device_name(recipe: Recipe) -> str:
    """torch's name for the recipe's device: cpu or cuda:N."""
    return f"cuda:{recipe.cuda_device}" if recipe.execution_provider == "cuda" else "cpu"
