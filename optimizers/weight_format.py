"""A weight format the champion's serving engine has beside its usual one for a quantization: llama.cpp's Q4_0
and IQ4_NL, 4-bit GGUF types made from the target's own weights by llama-quantize, whose blocks its CPU backend
repacks at load into the interleaved layout of its AVX2 / AVX-512 kernels (the server's log says so:
"CPU_REPACK model buffer size" at -lv 4). Q4_K_M, llama.cpp's usual int4, is mostly not repacked there. On
SmolLM2 at 2 cores Q4_0 served 1.17-1.19x the tokens/s of llama-server's Q8_0 defaults at c=4 and c=8
(docs/results.md). Accuracy and fidelity are gated like any quantization's: 4-bit weights made from weights that
were 4-bit before (SmolLM2's) did not pass."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer

FORMATS = ("Q4_0", "IQ4_NL")     # 4-bit formats: an int4 quantization each


class WeightFormat(Optimizer):
    cost = "mid"

    def __init__(self, format: str):
        if format not in FORMATS:
            raise ValueError(f"format must be one of {tuple(FORMATS)}, got {format!r}")
        self.format, self.name = format, format.lower()

    def check(self, env: Env, cand: Candidate) -> str | None:
        if cand.recipe.weight_format == self.format:
            return f"the champion's weights are already {self.format}"
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, quantization="int4", weight_format=self.format)
