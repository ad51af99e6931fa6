"""The torch encoder engine: the model with mean pooling, fp32/bf16/fp16, dynamic int8 on CPU."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from experiments.core.recipe import Candidate, device_name
from experiments.serving.backends.pytorch.causal_lm import linear_weight_bits
from experiments.serving.backends.pytorch.quantize import torch_refusal
from experiments.serving.encoder_engine import DTYPES, EncoderEngine, encoder_refusal, load_pooled


class TorchEncoder(EncoderEngine):
    name = "torch"

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if reason := encoder_refusal(recipe):
            return reason
        if recipe.precision not in DTYPES:
            return f"torch encoder has no precision {recipe.precision!r}; known: {', '.join(DTYPES)}"
        if recipe.compile == "tensorrt":
            return "the TensorRT path compiles the decoder's torch graph; it is not built for encoders"
        if recipe.compile not in ("none", "inductor"):
            return f"torch encoder has no compile mode {recipe.compile!r}"
        if recipe.quantization != "none" and recipe.execution_provider == "cuda":
            return "the torch encoder quantizes on CPU only (dynamic int8); torchao's CUDA path is built for decoders"
        return torch_refusal(recipe.quantization, recipe.precision, recipe.execution_provider)

    def __init__(self, cand: Candidate, threads: int, artefact_root: Path | None = None):   # builds no artefact
        self.require_buildable(cand)
        recipe = self.recipe = cand.recipe
        started = time.perf_counter()
        torch.set_num_threads(threads)
        self.device = torch.device(device_name(recipe))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)   # allocations without a device, and the NVML sampler, follow it
        self.model_dir = cand.target.model_dir
        self.model = load_pooled(self.model_dir, DTYPES[recipe.precision]).to(self.device)
        if recipe.quantization == "int8":   # on CPU: refuses() leaves no other scheme or device
            # the encoder's Linear layers, a scale per output channel (per tensor loses ~4 points of cosine
            # on MiniLM); the word embedding stays a float lookup
            self.model.encoder.encoder = torch.ao.quantization.quantize_dynamic(
                self.model.encoder.encoder, {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
                dtype=torch.qint8)
        self._forward = self.model
        if recipe.compile == "inductor":
            self._forward = torch.compile(self.model, dynamic=True)
            for width in (8, 64):   # compile now, not during the measured load
                self.embed([list(range(1, width + 1))] * 2)
        self.build_seconds = time.perf_counter() - started
        self.reused = False

    @torch.inference_mode()
    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        out = self._forward(torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device))
        return out.cpu().numpy()   # copies to host: compute time is real on a GPU too

    def artefact_paths(self) -> list[Path]:
        return sorted(Path(self.model_dir).glob("*.safetensors"))

    def weight_bits(self) -> float:
        return linear_weight_bits(self.model)
