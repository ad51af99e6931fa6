"""Torch: the model from its Hugging Face folder, greedy decode with a KV cache, step by step.

The recipe decides how it runs: dtype (fp32 / bf16 / fp16), device (cuda when the recipe's execution provider
is cuda), weight quantization (int8 dynamic on CPU; torchao int4 weight-only and float8 on CUDA), and
torch.compile — inductor over the dynamic-cache decode, or the torch-tensorrt backend on CUDA (CUDA graphs:
cuda_graph_engine.py). Compilation happens at build time, on warm-up prompts, and is reported as build_seconds.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import torch

from experiments.core.gpu_guards import tensorrt_options
from experiments.core.recipe import Candidate, device_name
from experiments.serving.backends.pytorch.quantize import quantize, torch_refusal
from experiments.serving.engine import Engine, genai_batching, unpaged_prefix

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("none", "inductor", "tensorrt")


class TorchEngine(Engine):
    name = "torch"

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if recipe.precision not in DTYPES:
            return f"torch engine has no precision {recipe.precision!r}; known: {', '.join(DTYPES)}"
        if recipe.compile not in COMPILE_MODES:
            return f"torch engine has no compile mode {recipe.compile!r}; known: {', '.join(COMPILE_MODES)}"
        if recipe.compile == "tensorrt" and recipe.execution_provider != "cuda":
            return "TensorRT needs a CUDA device"
        return (genai_batching(recipe) or continuous_refusal(recipe) or unpaged_prefix(recipe)
                or torch_refusal(recipe.quantization, recipe.precision, recipe.execution_provider,
                                 recipe.compile))

    @classmethod
    def batches_continuously(cls, recipe, scheduler: str) -> dict | None:
        return {"scheduler": scheduler}

    def __init__(self, cand: Candidate, threads: int, artefact_root: Path | None = None):   # builds no artefact
        from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy

        self.require_buildable(cand)
        recipe = self.recipe = cand.recipe
        started = time.perf_counter()
        torch.set_num_threads(threads)
        self.device = torch.device(device_name(recipe))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)   # allocations without a device, and the NVML sampler, follow it
        self.model_dir = cand.target.model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=DTYPES[recipe.precision],
                                                     use_safetensors=True).to(self.device)
        quantize(model, recipe.quantization, self.device)
        self.model = model.eval()
        self.quantization = recipe.quantization
        self._forward = self.model
        if recipe.cuda_graph:
            self._capture_decode()
        elif recipe.compile != "none":
            self._compile(recipe.compile)
        self.build_seconds = time.perf_counter() - started
        self.reused = False

    def _capture_decode(self) -> None:
        raise ValueError("the decode step is captured by CudaGraphEngine (experiments/serving/backends/pytorch/cuda_graph.py)")

    def _compile(self, mode: str) -> None:
        # Past the recompile limit dynamo would fall back to the eager module without a word: fail instead, so
        # a compiled engine is never measured or scored as an eager one.
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        if mode == "inductor":
            # dynamic=True: one graph for every cache length, instead of a recompile per decode step.
            self._forward = torch.compile(self.model, dynamic=True)
        elif mode == "tensorrt":

            self._forward = torch.compile(self.model, backend="tensorrt", dynamic=True, options=tensorrt_options())
        for n_in in (16, 48):   # warm-up: compile now, not during the measured load
            for _ in self.generate(list(range(1, n_in + 1)), 4):
                pass

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Iterator[tuple[int, float]]:
        from transformers import DynamicCache  # heavy

        cache = DynamicCache(config=self.model.config)
        step_input = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        position = torch.arange(len(prompt_ids), device=self.device)
        for _ in range(max_new_tokens):
            started = time.perf_counter()
            logits = self._forward(input_ids=step_input, past_key_values=cache, use_cache=True,
                                   cache_position=position).logits
            token = int(logits[0, -1].argmax())   # .item() syncs the device: compute time is real
            compute = time.perf_counter() - started
            yield token, compute
            step_input = torch.tensor([[token]], dtype=torch.long, device=self.device)
            position = position[-1:] + 1

    @property
    def serving_forward(self):
        """The callable that serves: the compiled one where the recipe compiles. Scores go through it, so a
        compiled engine is judged on its own kernels, not given the eager module's numbers."""
        return self._forward

    def lm_eval_model(self, batch_size: int):
        from lm_eval.models.huggingface import HFLM  # heavy

        kwargs = dict(pretrained=self.model, tokenizer=self.tokenizer, batch_size=batch_size, device=str(self.device))
        if self._forward is self.model:
            return HFLM(**kwargs)
        return _served_hflm(HFLM, self._forward, **kwargs)

    def artefact_paths(self) -> list[Path]:
        # A quantized or cast model exists only in memory; its weights come from the same safetensors.
        return sorted(Path(self.model_dir).glob("*.safetensors"))

    def weight_bits(self) -> float:
        """Stored bits per weight of the linear layers (lm_head included), as ONNX graphs are counted: packed
        quantized weights at their stored size, torchao tensor subclasses by their inner tensors."""
        return linear_weight_bits(self.model)


def continuous_refusal(recipe) -> str | None:
    """What the continuous-batching servers over the torch model (servers.serve) cannot do."""
    if recipe.batching != "continuous":
        return None
    if recipe.scheduler not in ("transformers", "own"):
        return f"unknown continuous scheduler {recipe.scheduler!r}; known: transformers, own"
    if recipe.scheduler == "transformers" and recipe.kv_num_blocks < 1:
        return ("kv_num_blocks: 0 (size from GPU memory) applies to onnxruntime-genai's paged engine on CUDA only; "
                "set a block count for transformers' scheduler over the torch model")
    if recipe.scheduler == "own" and recipe.prefix_caching:
        return ("the champion's own continuous scheduler keeps a left-padded batched KV cache, not a paged one: "
                "there are no blocks to share (prefix caching needs continuous_batching's scheduler: transformers)")
    if recipe.compile != "none" and recipe.scheduler == "own":
        return ("the own continuous scheduler runs the eager model on shapes that change every step (batch, "
                "cache length); compiling it is not built")
    if recipe.compile != "none":
        return "transformers' continuous batching runs its own paged forward; compile it through its config"
    return None


def _served_hflm(hflm_class, forward, **kwargs):
    """lm-eval's HF model whose forward is the engine's compiled callable instead of the eager module."""
    class ServedHFLM(hflm_class):
        def _model_call(self, inps, attn_mask=None, labels=None):
            with torch.no_grad():
                return forward(input_ids=inps, use_cache=False).logits

    return ServedHFLM(**kwargs)


def linear_weight_bits(model: torch.nn.Module) -> float:
    """Stored bits per weight over the model's Linear layers (dynamic int8 ones by their packed weights)."""
    stored, weights = 0, 0
    for module in model.modules():
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            weight, _ = module._packed_params._weight_bias()
        elif isinstance(module, torch.nn.Linear):
            weight = module.weight
        else:
            continue
        stored += _stored_bits(weight)
        weights += weight.shape[0] * weight.shape[1]
    return stored / max(1, weights)


def _stored_bits(tensor: torch.Tensor) -> int:
    """Bits a weight occupies; torchao tensor subclasses report their packed inner tensors."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(_stored_bits(getattr(tensor, n)) for n in names)
    return tensor.numel() * tensor.element_size() * 8
