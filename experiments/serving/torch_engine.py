"""Torch eager: the model from its Hugging Face folder, greedy decode with a KV cache, step by step."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import torch

from experiments.serving.engine import Engine
from optimizers.base import Candidate


class TorchEngine(Engine):
    name = "torch"

    def __init__(self, cand: Candidate, threads: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.model_dir = cand.target.model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32, use_safetensors=True)
        if cand.recipe.quantization == "int8":
            # Decoder layers only: quantizing the tied embedding would also change the input lookup.
            model.model.layers = torch.ao.quantization.quantize_dynamic(
                model.model.layers, {torch.nn.Linear}, dtype=torch.qint8)
        elif cand.recipe.quantization != "none":
            raise ValueError(f"torch engine has no {cand.recipe.quantization!r} path")
        self.model = model.eval()
        self.quantization = cand.recipe.quantization

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Iterator[tuple[int, float]]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        step_input = torch.tensor([prompt_ids], dtype=torch.long)
        for _ in range(max_new_tokens):
            started = time.perf_counter()
            logits = self.model(input_ids=step_input, past_key_values=cache, use_cache=True).logits
            token = int(logits[0, -1].argmax())
            compute = time.perf_counter() - started
            yield token, compute
            step_input = torch.tensor([[token]], dtype=torch.long)

    def lm_eval_model(self, batch_size: int):
        from lm_eval.models.huggingface import HFLM

        return HFLM(pretrained=self.model, tokenizer=self.tokenizer, batch_size=batch_size, device="cpu")

    def artefact_paths(self) -> list[Path]:
        # A dynamically quantized model exists only in memory; its weights come from the same safetensors.
        return sorted(Path(self.model_dir).glob("*.safetensors"))
