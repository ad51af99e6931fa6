"""INT8 weights for the decoder's linear layers, in the champion's engine (the tied embedding stays fp32)."""
from optimizers.base import Candidate, Env, Optimizer

SUPPORTED_ENGINES = ("torch", "onnxruntime")


class Int8Weights(Optimizer):
    name = "int8"
    cost = "mid"

    def check(self, env: Env, cand: Candidate) -> str | None:
        if cand.recipe.engine not in SUPPORTED_ENGINES:
            return f"no INT8 path for engine {cand.recipe.engine!r} (supported: {', '.join(SUPPORTED_ENGINES)})"
        if cand.recipe.quantization != "none":
            return f"the champion is already quantized ({cand.recipe.quantization})"
        return None

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, quantization="int8")
