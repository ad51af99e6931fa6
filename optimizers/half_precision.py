"""FP16 / BF16 weights and activations: bf16 on CPU, bf16 or fp16 on a GPU (both set in the rung's YAML). bf16 on a
GPU by default: torchao's int4 kernel computes in bf16 only, and bf16 keeps fp32's range."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer

HALF = ("bf16", "fp16")


class HalfPrecision(Optimizer):
    name = "half_precision"
    cost = "zero"

    def __init__(self, cpu_dtype: str = "bf16", cuda_dtype: str = "bf16"):
        if cpu_dtype not in HALF or cuda_dtype not in HALF:
            raise ValueError(f"cpu_dtype and cuda_dtype must be one of {HALF}, got {cpu_dtype!r}, {cuda_dtype!r}")
        self.cpu_dtype, self.cuda_dtype = cpu_dtype, cuda_dtype

    def dtype(self, cand: Candidate) -> str:
        return self.cuda_dtype if cand.recipe.execution_provider == "cuda" else self.cpu_dtype

    def check(self, env: Env, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if recipe.precision in HALF:
            return f"the champion already runs {recipe.precision}"
        if recipe.quantization != "none":
            return f"the champion's weights are {recipe.quantization}; half precision comes before quantization"
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, precision=self.dtype(cand))
