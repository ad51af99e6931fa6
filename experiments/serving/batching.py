"""A request queue, an admission policy, and onnxruntime-genai's Engine stepping the admitted batch.

static / dynamic: when the engine is idle, collect up to max_batch requests — waiting at most max_wait_ms
after the first — and run them to completion together. continuous: hand every request to the engine at once;
its paged KV cache lets sequences join and leave at each step. Each token is stamped as its step returns;
a request's model time is the compute of the steps it took part in.
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np

from experiments.core.request import RequestRecord
from experiments.serving.queue_server import QueueServer, collect_batch


class BatchingServer(QueueServer):
    thread_name = "roi-batching-server"

    def __init__(self, engine, kind: str, max_batch: int, max_wait_ms: float):
        import onnxruntime_genai as og  # heavy

        super().__init__()
        self._og = og
        self.kind, self.max_batch, self.max_wait_s = kind, max_batch, max_wait_ms / 1e3
        self._source = engine
        self._running: dict[int, tuple[object, RequestRecord]] = {}
        self._closing = False
        self._ready = threading.Event()
        self._start_error: Exception | None = None
        self._start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error

    def close(self) -> None:
        self._closing = True
        super().close()

    # --- the loop -----------------------------------------------------------------------------------------
    def _serve(self) -> None:
        # onnxruntime-genai requires every Engine call to come from the thread that created it.
        try:
            self._engine = self._source.step_engine()
            self._events = self._engine.create_event_buffer(max(256, 4 * self.max_batch))
        except Exception as exc:
            self._start_error = exc
            return
        finally:
            self._ready.set()
        while not self._closing or self._running:
            if self.kind == "continuous":
                self._admit(self._drain(block=not self._running))
            elif not self._running:
                self._admit(self._collect_batch())
            if self._running:
                self._step()

    def _collect_batch(self) -> list[RequestRecord]:
        return collect_batch(self._queue, self.max_batch, self.max_wait_s)

    def _drain(self, block: bool) -> list[RequestRecord]:
        recs = []
        try:
            rec = self._queue.get(timeout=0.05) if block else self._queue.get_nowait()
            while rec is not None:
                recs.append(rec)
                rec = self._queue.get_nowait()
        except queue.Empty:
            pass
        return recs

    def _admit(self, recs: list[RequestRecord]) -> None:
        for rec in recs:
            if rec.cancelled:
                rec.done.set()
                continue
            request = self._engine.create_request()
            options = self._og.TurnOptions(request)
            options.set_max_generated_tokens(rec.prompt.max_new_tokens)
            options.set_min_generated_tokens(rec.prompt.max_new_tokens)
            rec.engine_start = time.perf_counter()
            request.begin_turn(np.asarray(rec.prompt.token_ids, dtype=np.int32), options)
            self._running[id(request)] = (request, rec)

    def _step(self) -> None:
        started = time.perf_counter()
        try:
            events = self._engine.run(self._events)
        except Exception as exc:  # a failed step fails the requests in it, counted as errors
            for request, rec in self._running.values():
                rec.error = f"{type(exc).__name__}: {exc}"
                rec.done.set()
            self._running.clear()
            return
        now = time.perf_counter()
        for _, rec in self._running.values():
            rec.model_s += now - started
        for i in range(len(events)):
            event = events[i]
            request, rec = self._running.get(id(event.request), (None, None))
            if rec is None:
                continue
            rec.token_times.append(now)
            rec.tokens.append(int(event.token))
            if event.finish_reason != self._og.FinishReason.NONE or rec.cancelled:
                if event.finish_reason == self._og.FinishReason.FAILED:
                    rec.error = f"engine failed the request (code {event.error_code})"
                self._finish(request, rec)

    def _finish(self, request, rec: RequestRecord) -> None:
        self._running.pop(id(request), None)
        try:
            request.close()
        finally:
            rec.done.set()
