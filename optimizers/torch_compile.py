"""Engine swap inside torch: eager -> torch.compile (inductor). Compile time is paid at build, reported apart."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer


class TorchCompile(Optimizer):
    name = "torch_compile"
    cost = "zero"

    def check(self, env: Env, cand: Candidate) -> str | None:
        if cand.recipe.compile != "none" or cand.recipe.cuda_graph:
            return "the champion is already compiled"
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, compile="inductor")
