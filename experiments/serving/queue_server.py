"""What the load generators drive (`Server`), and the request queue with one worker thread that the queue-fed
servers share (one at a time, static/dynamic batching, encoder batching, our iteration-level scheduler)."""
from __future__ import annotations

import queue
import threading
import time
from typing import Protocol

from experiments.core.request import Prompt, RequestRecord


class Server(Protocol):
    def submit(self, prompt: Prompt, intended: float | None = None) -> RequestRecord:
        """Hand a request over, stamped as arriving at `intended` (perf_counter; now when None)."""

    def close(self) -> None:
        """Serve or fail what was submitted, then stop."""


class QueueServer:
    """A FIFO of submitted requests and one worker thread running `_serve` until it takes the None that `close`
    puts. A subclass sets itself up, then calls `_start()`."""
    thread_name = "roi-server"
    close_timeout_s = 60.0

    def __init__(self):
        self._queue: queue.Queue[RequestRecord | None] = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name=self.thread_name, daemon=True)

    def _start(self) -> None:
        self._worker.start()

    def submit(self, prompt: Prompt, intended: float | None = None) -> RequestRecord:
        rec = RequestRecord.arriving(prompt, intended)
        self._queue.put(rec)
        return rec

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=self.close_timeout_s)

    def _serve(self) -> None:
        raise NotImplementedError


def collect_batch(requests: queue.Queue, max_batch: int, max_wait_s: float) -> list[RequestRecord]:
    """Block for the first request, then take up to max_batch, waiting at most max_wait_s after the first;
    [] once the queue is closed (None)."""
    first = requests.get()
    if first is None:
        return []
    batch, deadline = [first], time.perf_counter() + max_wait_s
    while len(batch) < max_batch:
        try:
            rec = requests.get(timeout=max(0.0, deadline - time.perf_counter()))
        except queue.Empty:
            break
        if rec is None:
            requests.put(None)   # the close is for the serving loop too
            break
        batch.append(rec)
    return batch
