"""Speculative decoding with a draft model the user names (`target.draft_model`): a smaller model with the
target's tokenizer proposes the next tokens, the target verifies them in one forward pass and keeps those it
would have chosen itself, so greedy outputs are unchanged by construction. It pays where the draft is much
cheaper than the target and often right; on a memory-bound CPU the draft's own weights are read every token too,
so only a measurement says. llama-server runs it (--spec-type draft-simple --model-draft); without a draft
named the rung skips, saying so.
"""
from pathlib import Path

from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer


class DraftSpeculation(Optimizer):
    name = "speculative_draft"
    cost = "zero"

    def __init__(self, draft_model: str | None = None):
        """draft_model: a GGUF file or a Hugging Face folder with the target's tokenizer; None: not named."""
        if draft_model and not Path(draft_model).exists():
            raise ValueError(f"target.draft_model {draft_model} does not exist: name a smaller model with the "
                             f"target's tokenizer (a GGUF file or a Hugging Face folder), or leave it out")
        self.draft_model = str(Path(draft_model).resolve()) if draft_model else None

    def check(self, env: Env, cand: Candidate) -> str | None:
        if not self.draft_model:
            return ("no draft model named: set target.draft_model to a smaller model with the target's tokenizer "
                    "(a GGUF file or a Hugging Face folder)")
        if cand.recipe.speculative != "none":
            return f"the champion already decodes speculatively ({cand.recipe.speculative})"
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, speculative="draft", draft_model=self.draft_model or "")
