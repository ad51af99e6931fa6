"""The engine's compute threads: all of the sweep's `threads` but `spare_cores`, which are left to the rest of the
serving process — its HTTP thread, tokenizer and scheduler, and on this machine the load's client. On 2 cores a
server whose every core decodes makes each request's parsing and streaming wait for a core; one that leaves a
core idle decodes on one. Only a measurement says which costs less, so it is a rung, gated like any other.

llama-server decodes on the rest and still processes prompts on all (--threads-batch); an in-process engine
computes on the rest. vLLM's CPU build already binds its model's threads away from its scheduler's core.
"""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer


class ComputeThreads(Optimizer):
    name = "compute_threads"
    cost = "zero"

    def __init__(self, spare_cores: int = 1):
        if spare_cores < 1:
            raise ValueError(f"spare_cores must be >= 1 (cores kept from the engine's compute), got {spare_cores}")
        self.spare_cores = spare_cores

    def check(self, env: Env, cand: Candidate) -> str | None:
        r = cand.recipe
        if r.threads:
            return f"the champion's threads are already set ({r.threads})"
        if r.execution_provider == "cuda":
            return "the champion computes on a CUDA device: its CPU threads only feed it"
        if env.cpu_count <= self.spare_cores:
            return f"this machine has {env.cpu_count} core(s): none to spare beside the engine's compute"
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, threads=-self.spare_cores)
