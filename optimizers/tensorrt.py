"""Engine swap to TensorRT on a CUDA device: torch.compile with the torch-tensorrt backend (`gpu` extra).

TensorRT builds engines for the GPU it runs on; with no CUDA device, without torch-tensorrt, or with a champion
that runs on the CPU (target.device), the rung does not apply and says why. It keeps the champion's device and
dtype: torch-tensorrt 2.14 builds strongly typed engines from the graph's own dtypes, so the swap is the swap
alone (half precision is a rung of its own).
"""
import importlib.util

from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer


class TensorRT(Optimizer):
    name = "tensorrt"
    cost = "zero"

    def machine_check(self, env: Env) -> str | None:
        if not env.cuda:
            return "TensorRT builds engines for an NVIDIA GPU: no CUDA device is present"
        if importlib.util.find_spec("torch_tensorrt") is None:
            return "torch-tensorrt is not installed: pip install -e '.[gpu]'"
        return None

    def check(self, env: Env, cand: Candidate) -> str | None:
        if reason := self.machine_check(env):
            return reason
        if cand.recipe.compile == "tensorrt":
            return "the champion already runs TensorRT"
        if cand.recipe.execution_provider != "cuda":
            return ("the champion runs on the CPU (target.device); TensorRT would move it to the GPU too, and the "
                    "gain would be the move's: set target.device=cuda to climb on the GPU")
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, engine="torch", compile="tensorrt", batching="none", max_batch=1)
