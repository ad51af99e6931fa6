"""Continuous batching over a paged KV cache: transformers' ContinuousBatchingManager driving the torch model.

Iteration-level scheduling: a request that arrives joins the running batch at the next step (its prefill
shares the step with the others' decode) and a finished sequence leaves at once, returning its KV blocks to
the pool. The pool is `kv_num_blocks` blocks of `kv_block_size` tokens, so the memory a sequence holds tracks
its length. With prefix caching, full blocks of a prompt prefix already in the pool are shared, not recomputed.

Each token is stamped when its step's output reaches this server; a request's model time is the compute of
the steps it took part in (every step is timed), its queue time ends when the scheduler first admitted it.
"""
from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass

from experiments.core.request import Prompt, RequestRecord


@dataclass(frozen=True)
class KvUsage:
    blocks_in_use: int
    blocks_total: int
    bytes_per_block: int

    @property
    def mb_in_use(self) -> float:
        return self.blocks_in_use * self.bytes_per_block / 2**20


class ContinuousServer:
    def __init__(self, engine, max_batch_tokens: int, kv_block_size: int, kv_num_blocks: int,
                 prefix_caching: bool):
        from transformers import GenerationConfig  # heavy
        from transformers.generation.configuration_utils import ContinuousBatchingConfig  # heavy

        if kv_block_size < 1 or kv_num_blocks < 1 or max_batch_tokens < 1:
            raise ValueError(f"continuous batching needs kv_block_size, kv_num_blocks and max_batch_tokens >= 1 "
                             f"(got {kv_block_size}, {kv_num_blocks}, {max_batch_tokens})")
        self.model = engine.model
        self._attn_before = self.model.config._attn_implementation
        generation = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=1)
        paging = ContinuousBatchingConfig(block_size=kv_block_size, num_blocks=kv_num_blocks,
                                          max_batch_tokens=max_batch_tokens, allow_block_sharing=prefix_caching,
                                          use_cuda_graph=False)
        self._manager = self.model.init_continuous_batching(generation_config=generation,
                                                            continuous_batching_config=paging)
        self._step_ends: list[float] = []
        self._step_seconds: list[float] = []
        self._timed_steps()
        self._records: dict[str, RequestRecord] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._manager.start()
        self._router = threading.Thread(target=self._route, name="roi-continuous-router", daemon=True)
        self._router.start()

    def _timed_steps(self) -> None:
        step = self._manager._generation_step

        def timed():
            started = time.perf_counter()
            step()
            ended = time.perf_counter()
            self._step_ends.append(ended)
            self._step_seconds.append(ended - started)

        # The manager calls self._generation_step(); an instance attribute wraps it without a subclass.
        self._manager._generation_step = timed

    def submit(self, prompt: Prompt, intended: float | None = None) -> RequestRecord:
        rec = RequestRecord.arriving(prompt, intended)
        with self._lock:
            request_id = self._manager.add_request(list(prompt.token_ids), max_new_tokens=prompt.max_new_tokens,
                                                   streaming=True, eos_token_id=-1)
            self._records[request_id] = rec
        return rec

    def _route(self) -> None:
        while not self._closing.is_set():
            output = self._manager.get_result(timeout=0.05)
            if output is None:
                if not self._manager.is_running() and self._records:
                    self._fail_all("the continuous batching loop stopped")
                continue
            now = time.perf_counter()
            with self._lock:
                rec = self._records.get(output.request_id)
            if rec is None:
                continue
            if rec.engine_start is None and output.lifespan[0] > 0:
                rec.engine_start = output.lifespan[0]
            for token in output.generated_tokens[len(rec.tokens):]:
                rec.tokens.append(int(token))
                rec.token_times.append(now)
            if output.error:
                rec.error = f"continuous batching: {output.error}"
            if output.is_finished() or output.error or rec.cancelled:
                if rec.cancelled and not output.is_finished():
                    self._manager.cancel_request(output.request_id)
                self._finish(output.request_id, rec)

    def _finish(self, request_id: str, rec: RequestRecord) -> None:
        with self._lock:
            self._records.pop(request_id, None)
        if rec.engine_start is not None and rec.token_times:
            first = bisect.bisect_left(self._step_ends, rec.engine_start)
            last = bisect.bisect_right(self._step_ends, rec.token_times[-1])
            rec.model_s = sum(self._step_seconds[first:last])
        rec.done.set()

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            pending, self._records = list(self._records.values()), {}
        for rec in pending:
            rec.error = reason
            rec.done.set()

    def kv_usage(self) -> KvUsage | None:
        processor = self._manager.batch_processor
        if processor is None:
            return None
        cache = processor.cache
        total = cache.num_blocks
        layers, heads, dim = len(cache.key_cache), cache.num_key_value_heads, cache.head_dim
        per_block = 2 * layers * cache.block_size * heads * dim * cache.key_cache[0].element_size()
        return KvUsage(total - cache.get_num_free_blocks(), total, per_block)

    def close(self) -> None:
        self._manager.stop(block=True, timeout=60)
        self._closing.set()
        self._router.join(timeout=10)
        self._fail_all("server closed")
        # The manager switched the model to paged attention; lm-eval and fidelity need it back as it was.
        self.model.set_attn_implementation(self._attn_before)
