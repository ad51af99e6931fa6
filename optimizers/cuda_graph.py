"""CUDA Graph: the decode step captured once and replayed over a static KV cache allocated once per engine
(experiments/serving/cuda_graph_engine.py). Launch overhead is what it removes, so it exists only on a CUDA device."""
from optimizers.base import Candidate, Env, Optimizer


class CudaGraph(Optimizer):
    name = "cuda_graph"
    cost = "zero"

    def machine_check(self, env: Env) -> str | None:
        return None if env.cuda else "CUDA Graph replays GPU kernel launches: no CUDA device is present"

    def check(self, env: Env, cand: Candidate) -> str | None:
        if reason := self.machine_check(env):
            return reason
        if not cand.target.decodes:
            return "graph capture here is of the decode step over a static KV cache; an encoder has neither"
        if cand.recipe.engine != "torch":
            return (f"the champion runs {cand.recipe.engine}; graph capture here is of the torch model's decode step "
                    f"over a static cache")
        if cand.recipe.batching != "none":
            return f"the champion batches ({cand.recipe.batching}); a captured graph has one fixed batch shape"
        if cand.recipe.cuda_graph:
            return "the champion already replays a CUDA graph"
        if cand.recipe.compile != "none":
            return (f"the champion is compiled ({cand.recipe.compile}); the graph is captured from the eager model, "
                    f"so this rung would undo the compilation rather than add to it")
        if cand.recipe.execution_provider != "cuda":
            return ("the champion runs on the CPU (target.device); capturing graphs would move it to the GPU too, "
                    "and the gain would be the move's: set target.device=cuda to climb on the GPU")
        return None

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, cuda_graph=True)
