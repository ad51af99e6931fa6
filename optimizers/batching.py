"""Batching: static -> dynamic -> continuous, over onnxruntime-genai's Engine (its own step loop).

static: wait for a full batch of B (or a timeout), run it to completion, then the next batch (the seed's
"static batch of 4"); dynamic: run when either B requests or the wait window is reached; continuous:
requests join and leave the running batch at every step, over a paged KV cache.
"""
from optimizers.base import Candidate, Env, Optimizer

KINDS = ("static", "dynamic", "continuous")


class Batching(Optimizer):
    cost = "zero"

    def __init__(self, kind: str, max_batch: int, max_wait_ms: float = 0.0, kv_block_size: int = 256,
                 kv_num_blocks: int = 0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch must be >= 1 and max_wait_ms >= 0 (got {max_batch}, {max_wait_ms})")
        self.name = f"{kind}_batching"
        self.kind, self.max_batch, self.max_wait_ms = kind, max_batch, max_wait_ms
        self.kv_block_size, self.kv_num_blocks = kv_block_size, kv_num_blocks

    def check(self, env: Env, cand: Candidate) -> str | None:
        if cand.recipe.engine != "onnxruntime":
            return f"the batching schedulers drive onnxruntime-genai's Engine; the champion runs {cand.recipe.engine}"
        if self.kind == "continuous" and not env.cuda:
            return ("continuous batching needs onnxruntime-genai's PagedAttention export, which runs on CUDA "
                    "(fp16/bf16) only; on CPU its Engine batches statically")
        if cand.recipe.batching in KINDS and KINDS.index(self.kind) <= KINDS.index(cand.recipe.batching):
            return f"the champion already uses {cand.recipe.batching} batching"
        return None

    def apply(self, cand: Candidate) -> Candidate:
        changes = {"batching": self.kind, "max_batch": self.max_batch, "max_wait_ms": self.max_wait_ms}
        if self.kind == "continuous":
            changes.update(kv_block_size=self.kv_block_size, kv_num_blocks=self.kv_num_blocks,
                           execution_provider="cuda", precision="fp16")
        return cand.edited(self.name, **changes)
