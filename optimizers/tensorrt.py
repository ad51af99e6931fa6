"""Engine swap to TensorRT on a CUDA device: torch.compile with the torch-tensorrt backend (`gpu` extra).

TensorRT builds engines for the GPU it runs on; with no CUDA device, or without torch-tensorrt installed,
the rung does not apply and says why.
"""
import importlib.util

from optimizers.base import Candidate, Env, Optimizer


class TensorRT(Optimizer):
    name = "tensorrt"
    cost = "zero"

    def __init__(self, precision: str = "fp16"):
        if precision not in ("fp32", "fp16", "bf16"):
            raise ValueError(f"precision must be fp32, fp16 or bf16, got {precision!r}")
        self.precision = precision

    def machine_check(self, env: Env) -> str | None:
        if not env.cuda:
            return "TensorRT builds engines for an NVIDIA GPU: no CUDA device is present"
        if importlib.util.find_spec("torch_tensorrt") is None:
            return "torch-tensorrt is not installed: pip install -e '.[gpu]'"
        return None

    def check(self, env: Env, cand: Candidate) -> str | None:
        if reason := self.machine_check(env):
            return reason
        if not cand.target.decodes:
            return "the TensorRT path compiles the decoder's torch graph; it is not built for encoders"
        if cand.recipe.compile == "tensorrt":
            return "the champion already runs TensorRT"
        return None

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, engine="torch", compile="tensorrt", execution_provider="cuda",
                           precision=self.precision, batching="none", max_batch=1)
