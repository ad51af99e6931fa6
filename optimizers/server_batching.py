"""The serving engine's own continuous batch, sized to the load the sweep serves: the requests its server runs at
once (vLLM's --max-num-seqs, llama-server's --parallel slots) set to the most requests the champion's load ladder
had in flight, and, where given, the tokens one step carries (vLLM's --max-num-batched-tokens, its chunked
prefill's chunk; llama-server's --batch-size and --ubatch-size).

More sequences than the load ever sends hold KV cache that no request uses: llama-server allocates each slot's
context at start-up, so fewer slots are a memory saving (aimed at memory). Fewer than the load sends queue
requests the server could batch: more are a speed gain (aimed at speed). An engine whose KV pool has a fixed
budget whatever the batch (vLLM, SGLang, TensorRT-LLM) saves nothing with fewer sequences: there the batch only
grows.
"""
from experiments.core.recipe import Candidate, Env
from experiments.core.reports import peak_in_flight
from experiments.serving import engine_class, fixed_kv_budget, refusal
from experiments.serving.backends.served import ServedEngine
from optimizers.base import Optimizer

PEAK = "peak"      # max_num_seqs sized to the most requests the champion's load ladder had in flight


class ServerBatching(Optimizer):
    name = "server_batching"
    cost = "zero"

    def __init__(self, max_num_seqs: int | str = PEAK, max_num_batched_tokens: int = 0):
        """max_num_seqs: an int, or "peak"; max_num_batched_tokens: tokens per step (0: keep the champion's)."""
        if max_num_seqs != PEAK and (not isinstance(max_num_seqs, int) or max_num_seqs < 1):
            raise ValueError(f"max_num_seqs must be {PEAK!r} or an int >= 1, got {max_num_seqs!r}")
        if max_num_batched_tokens < 0:
            raise ValueError(f"max_num_batched_tokens must be >= 0 (0: keep the champion's), got "
                             f"{max_num_batched_tokens}")
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.peak: int | None = None
        self.from_batch: int | None = None     # the champion's, as `apply` found it
        self.no_peak = "the champion has no load ladder to size the batch to"

    def observe(self, champion) -> None:
        bench = getattr(champion, "bench", None)
        self.peak, why = peak_in_flight(bench) if bench is not None else (None, "no load ladder was measured")
        self.no_peak = f"the champion's load gives no peak to size the batch to ({why})"

    def sequences(self) -> int | None:
        return self.peak if self.max_num_seqs == PEAK else self.max_num_seqs

    def check(self, env: Env, cand: Candidate) -> str | None:
        self.decision = ""
        r = cand.recipe
        try:
            served = issubclass(engine_class(cand), ServedEngine)
        except ValueError as no_engine:
            return str(no_engine)
        if not served:
            return (f"the champion runs {r.engine} in process: its batching rungs are static, dynamic and "
                    f"continuous_batching")
        if self.sequences() is None:
            return f"max_num_seqs={PEAK}, but {self.no_peak}"
        seqs, tokens = self._sized(cand)
        if (seqs, tokens) == (r.max_batch, r.max_tokens_per_step):
            if self.sequences() < r.max_batch:
                return (f"{r.engine} sizes its KV pool from a fixed budget whatever the batch: "
                        f"{self.sequences()} sequences instead of {r.max_batch} would only cap it, saving no memory")
            return (f"the champion's {r.engine} server already runs {r.max_batch} requests at once"
                    + (" (the load's peak)" if self.max_num_seqs == PEAK else "")
                    + (f" and {tokens} tokens a step" if tokens else ""))
        self.decision = self._why(r, seqs, tokens)
        return refusal(self.apply(cand))

    def _sized(self, cand: Candidate) -> tuple[int, int]:
        """(requests at once, tokens a step) for `cand`'s server: on a fixed KV budget, never fewer requests."""
        seqs, r = self.sequences(), cand.recipe
        if seqs < r.max_batch and fixed_kv_budget(cand):
            seqs = r.max_batch
        return seqs, self.max_num_batched_tokens or r.max_tokens_per_step

    def _why(self, r, seqs: int, tokens: int) -> str:
        load = (f"the load peaks at {self.peak} requests in flight" if self.max_num_seqs == PEAK
                else f"max_num_seqs is set to {self.max_num_seqs}")
        changes = [f"{r.engine}'s batch {r.max_batch} -> {seqs} requests at once" if seqs != r.max_batch
                   else f"{r.engine}'s batch stays {seqs} requests at once"]
        if tokens != r.max_tokens_per_step:
            changes.append(f"{r.max_tokens_per_step or 'default'} -> {tokens} tokens a step")
        return f"{load}: {', '.join(changes)}"

    def aim_for(self, cand: Candidate) -> str:
        # the aim follows the change: fewer sequences (only where KV is allocated per sequence) can only save
        # memory; more, or other tokens a step, are for speed
        shrinks = self.from_batch is not None and cand.recipe.max_batch < self.from_batch
        return "memory" if shrinks else "speed"

    def apply(self, cand: Candidate) -> Candidate:
        if self.sequences() is None:
            raise ValueError(f"max_num_seqs={PEAK}, but {self.no_peak}")
        seqs, tokens = self._sized(cand)
        self.from_batch = cand.recipe.max_batch
        return cand.edited(self.name, batching="continuous", max_batch=seqs, max_tokens_per_step=tokens)
