"""Prefix caching: full KV blocks of a prompt prefix already in the paged cache are shared, not recomputed,
so a shared system prompt costs its prefill once (measure it with target.workload.shared_prefix_tokens)."""
from experiments.core.recipe import Candidate, Env
from experiments.serving import refusal
from optimizers.base import Optimizer


class PrefixCaching(Optimizer):
    name = "prefix_caching"
    cost = "mid"

    def check(self, env: Env, cand: Candidate) -> str | None:
        if cand.recipe.prefix_caching:
            return "the champion already caches prefixes"
        return refusal(self.apply(cand))

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, prefix_caching=True)
