"""A serving engine exactly as its users start it: `llama-server -m model.gguf`, `vllm serve <folder>`, nothing
else set. What a user would run anyway, measured on the sweep's load and gated like any candidate: a default
faster than the champion becomes the champion, so a ladder never ends slower than a default that passes its
accuracy and fidelity (issue 41: the SmolLM2 champion served 0.7-0.8x of llama-server's defaults).

It starts from the target as the user has it, not from the champion's recipe: llama.cpp serves a Q8_0 made from
the target's weights (llama.cpp's usual quantization, what one downloads or makes with llama-quantize); vLLM the
checkpoint at its own dtype. Any rung after it edits an explicit recipe (Candidate.edited clears `defaults`).
"""
from experiments.core.recipe import Candidate, Env, Recipe
from experiments.serving import refusal
from optimizers.base import Optimizer

# What each engine's defaults are, as recipe fields (its command passes none of them: recipe.defaults): llama-server
# runs 4 slots over a unified KV cache (--parallel -1, auto); vLLM's OpenAI server 256 sequences (--max-num-seqs),
# at dtype auto, which downcasts an fp32 checkpoint to bf16 on a CPU that has it.
DEFAULTS = {
    "llama.cpp": {"quantization": "int8", "max_batch": 4},       # served from a Q8_0 made from the weights
    "vllm": {"precision": "bf16", "max_batch": 256},
}
STARTED_AS = {"llama.cpp": "llama-server -m <a Q8_0 GGUF of the target's weights>",
              "vllm": "vllm serve <the target's folder>"}


class EngineDefaults(Optimizer):
    cost = "zero"

    def __init__(self, engine: str):
        if engine not in DEFAULTS:
            raise ValueError(f"engine must be one of {tuple(DEFAULTS)}, got {engine!r}")
        self.engine = engine
        self.name = f"{engine.replace('.', '_')}_defaults"

    def check(self, env: Env, cand: Candidate) -> str | None:
        if cand.recipe.defaults and cand.recipe.engine == self.engine:
            return f"the champion is {self.engine} with its defaults"
        defaults = self.apply(cand)
        if reason := refusal(defaults):
            return reason
        self.decision = f"{self.engine} started as its users start it: {STARTED_AS[self.engine]}"
        return None

    def apply(self, cand: Candidate) -> Candidate:
        recipe = Recipe(engine=self.engine, execution_provider=cand.recipe.execution_provider,
                        cuda_device=cand.recipe.cuda_device, batching="continuous", prefix_caching=True,
                        defaults=True, **DEFAULTS[self.engine])
        return Candidate(cand.target, recipe, (cand.rungs[0], self.name))


def is_default(outcome) -> bool:
    """Whether a rung's outcome is an engine's defaults (a reference row)."""
    cand = getattr(outcome, "candidate", None)
    return cand is not None and cand.recipe.defaults
