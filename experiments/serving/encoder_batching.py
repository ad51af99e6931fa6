"""Static and dynamic batching for encoders: collect up to max_batch requests (waiting at most max_wait_ms after
the first), run them as one padded forward pass, answer them all when it returns.

Every request of a batch shares its engine start and its model time (the batch's compute), which is how the
report gets latency per batch as well as per request.
"""
from __future__ import annotations

import time

from experiments.core.request import RequestRecord
from experiments.serving.queue_server import QueueServer, collect_batch


class EncoderBatchServer(QueueServer):
    thread_name = "roi-encoder-batching"

    def __init__(self, engine, max_batch: int, max_wait_ms: float):
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch must be >= 1 and max_wait_ms >= 0 (got {max_batch}, {max_wait_ms})")
        super().__init__()
        self.engine, self.max_batch, self.max_wait_s = engine, max_batch, max_wait_ms / 1e3
        self._start()

    def _serve(self) -> None:
        while batch := collect_batch(self._queue, self.max_batch, self.max_wait_s):
            for rec in [r for r in batch if r.cancelled]:
                rec.done.set()
            batch = [r for r in batch if not r.cancelled]
            if batch:
                self._run(batch)

    def _run(self, batch: list[RequestRecord]) -> None:
        started = time.perf_counter()
        for rec in batch:
            rec.engine_start = started
        try:
            _, compute = self.engine.embed([list(r.prompt.token_ids) for r in batch])
        except Exception as exc:  # a failed batch fails its requests, counted as errors
            for rec in batch:
                rec.error = f"{type(exc).__name__}: {exc}"
                rec.done.set()
            return
        now = time.perf_counter()
        for rec in batch:
            rec.model_s = compute
            rec.token_times.append(now)
            rec.tokens.append(0)
            rec.done.set()
