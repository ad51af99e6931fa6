"""The first rung: the model as it is, torch eager, on the device `target.device` chose — the champion every rung
must beat. On a GPU at the checkpoint's own dtype (what serving it unoptimized means there); on the CPU in fp32,
whose half-precision kernels are few (bf16 there is the half_precision rung's to try)."""
from experiments.core.recipe import Candidate
from optimizers.base import Optimizer
from optimizers.placement import native_precision


class EagerBaseline(Optimizer):
    name = "baseline"
    cost = "zero"

    def apply(self, cand: Candidate) -> Candidate:
        on_cuda = cand.recipe.execution_provider == "cuda"
        precision = native_precision(cand.target.model_dir) if on_cuda else "fp32"
        return cand.edited(self.name, engine="torch", precision=precision, quantization="none")
