"""CUDA Graph: the decode step captured once and replayed over a static KV cache allocated once per engine
(experiments/serving/backends/pytorch/cuda_graph.py). Launch overhead is what it removes, so it exists only on a CUDA device."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer


class CudaGraph(Optimizer):
    name = "cuda_graph"
    cost = "zero"

    def machine_check(self, env: Env) -> str | None:
        return None if env.cuda else "CUDA Graph replays GPU kernel launches: no CUDA device is present"

    def check(self, env: Env, cand: Candidate) -> str | None:
        if reason := self.machine_check(env):
            return reason
        if cand.recipe.cuda_graph:
            return "the champion already replays a CUDA graph"
        if reason := refusal(self.apply(cand)):
            return reason
        if cand.recipe.execution_provider != "cuda":
            return ("the champion runs on the CPU (target.device); capturing graphs would move it to the GPU too, "
                    "and the gain would be the move's: set target.device=cuda to climb on the GPU")
        return None

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, cuda_graph=True)
