"""Batching: static -> dynamic -> continuous.

static: wait for a full batch of B (or a timeout), run it to completion, then the next batch (the seed's
"static batch of 4"); dynamic: run when either B requests or the wait window is reached — both over
onnxruntime-genai's Engine for a causal LM, over one padded forward pass of any encoder engine for an embedding
target. continuous: requests join and leave the running batch at every step over a paged
KV cache — onnxruntime-genai's PagedAttention on CUDA, elsewhere the torch model under one of two
iteration-level schedulers (`scheduler`): transformers' continuous-batching manager over a paged KV cache, or
our own over a left-padded batched KV cache (experiments/serving/iteration.py) — since onnxruntime-genai's
CPU Engine batches statically only.
"""
from experiments.core.recipe import Candidate, Env
from experiments.serving import continuous_changes, refusal
from optimizers.base import Optimizer

KINDS = ("static", "dynamic", "continuous")
SCHEDULERS = ("transformers", "own")    # continuous batching over the torch model
FIXED_SHAPES = "a compiled or graph-captured champion has fixed shapes; batching comes before compilation here"


class Batching(Optimizer):
    cost = "zero"

    def __init__(self, kind: str, max_batch: int, max_wait_ms: float = 0.0, kv_block_size: int = 16,
                 kv_num_blocks: int = 0, max_tokens_per_step: int = 0, scheduler: str | None = None):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if scheduler is not None and (kind != "continuous" or scheduler not in SCHEDULERS):
            raise ValueError(f"scheduler selects the continuous-batching implementation: one of {SCHEDULERS}, "
                             f"with kind: continuous only (got scheduler={scheduler!r}, kind={kind!r})")
        if scheduler == "own" and max_tokens_per_step < 1:
            raise ValueError(f"the own continuous scheduler needs max_tokens_per_step >= 1 (got {max_tokens_per_step})")
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch must be >= 1 and max_wait_ms >= 0 (got {max_batch}, {max_wait_ms})")
        if kind == "continuous" and (kv_block_size < 1 or kv_num_blocks < 0 or max_tokens_per_step < 0):
            raise ValueError("continuous batching needs kv_block_size >= 1, kv_num_blocks >= 0 (0 = size from GPU "
                             f"memory), max_tokens_per_step >= 0 (got {kv_block_size}, {kv_num_blocks}, "
                             f"{max_tokens_per_step})")
        self.name = f"{kind}_batching"
        self.kind, self.max_batch, self.max_wait_ms = kind, max_batch, max_wait_ms
        self.kv_block_size, self.kv_num_blocks = kv_block_size, kv_num_blocks
        self.max_tokens_per_step = max_tokens_per_step
        self.scheduler = scheduler or "transformers"

    def check(self, env: Env, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if recipe.batching in KINDS and KINDS.index(self.kind) <= KINDS.index(recipe.batching):
            return f"the champion already uses {recipe.batching} batching"
        compiled = recipe.cuda_graph or recipe.compile != "none"
        if compiled and self.kind == "continuous":
            return FIXED_SHAPES
        produced = self.apply(cand)
        if reason := refusal(produced):
            return reason
        if self.kind == "continuous" and produced.recipe.execution_provider == "cuda" and not env.cuda:
            return "continuous batching on the champion's CUDA device: no CUDA device is present"
        if compiled:
            return FIXED_SHAPES
        return None

    def apply(self, cand: Candidate) -> Candidate:
        changes = {"batching": self.kind, "max_batch": self.max_batch, "max_wait_ms": self.max_wait_ms}
        if self.kind == "continuous":
            changes.update(kv_block_size=self.kv_block_size, kv_num_blocks=self.kv_num_blocks,
                           max_tokens_per_step=self.max_tokens_per_step)
            # the engine says how it batches continuously (onnxruntime-genai's paged engine: CUDA, fp16 or bf16);
            # one that cannot leaves it to a scheduler over the torch model
            changes.update(continuous_changes(cand, self.scheduler))
        return cand.edited(self.name, **changes)
