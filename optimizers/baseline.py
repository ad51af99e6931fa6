"""The first rung: the model as it is, torch eager fp32 — the champion every rung must beat."""
from optimizers.base import Candidate, Optimizer


class EagerBaseline(Optimizer):
    name = "baseline"
    cost = "zero"

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, engine="torch", precision="fp32", quantization="none")
