"""Prefix caching: full KV blocks of a prompt prefix already in the paged cache are shared, not recomputed,
so a shared system prompt costs its prefill once (measure it with target.workload.shared_prefix_tokens)."""
from optimizers.base import Candidate, Env, Optimizer


class PrefixCaching(Optimizer):
    name = "prefix_caching"
    cost = "mid"

    def check(self, env: Env, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if not cand.target.decodes:
            return "prefix caching reuses KV-cache blocks of a decoder; an encoder keeps no KV cache"
        if recipe.batching != "continuous":
            return (f"prefix caching shares blocks of a paged KV cache, which comes with continuous batching; "
                    f"the champion's batching is {recipe.batching}")
        if recipe.engine != "torch":
            return f"onnxruntime-genai's paged engine ({recipe.engine}) has no prefix sharing"
        if recipe.scheduler == "own":
            return ("the champion's own continuous scheduler keeps a left-padded batched KV cache, not a paged one: "
                    "there are no blocks to share (prefix caching needs continuous_batching's scheduler: transformers)")
        if recipe.prefix_caching:
            return "the champion already caches prefixes"
        return None

    def apply(self, cand: Candidate) -> Candidate:
        return cand.edited(self.name, prefix_caching=True)
