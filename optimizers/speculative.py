"""Speculative decoding by n-gram lookup: the serving engine proposes the next tokens by matching the latest ones
against the prompt and what it generated so far, and verifies them in one forward pass; no second model. Greedy
outputs are unchanged by construction; it pays where outputs repeat their input (code edits, summaries, RAG)."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer


class NgramSpeculation(Optimizer):
    name = "speculative_ngram"
    cost = "zero"

    def check(self, env: Env, cand: Candidate) -> str | None:
        if cand.recipe.speculative != "none":
            return f"the champion already decodes speculatively ({cand.recipe.speculative})"
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, speculative="ngram")
