"""Engine swap inside torch: eager -> torch.compile (inductor). Compile time is paid at build, reported apart."""
from optimizers.base import Candidate, Env, Optimizer


class TorchCompile(Optimizer):
    name = "torch_compile"
    cost = "zero"

    def check(self, env: Env, cand: Candidate) -> str | None:
        if cand.recipe.engine != "torch":
            return f"torch.compile compiles the torch engine; the champion runs {cand.recipe.engine}"
        if cand.recipe.compile != "none" or cand.recipe.cuda_graph:
            return "the champion is already compiled"
        if cand.recipe.batching == "continuous" and cand.recipe.scheduler == "own":
            return ("the own continuous scheduler runs the eager model on shapes that change every step (batch, "
                    "cache length); compiling it is not built")
        if cand.recipe.batching == "continuous":
            return "transformers' continuous batching runs its own paged forward; compile it through its config"
        return None

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, compile="inductor")
