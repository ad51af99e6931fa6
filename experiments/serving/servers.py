"""The server in front of an engine: a FIFO queue serving one request at a time, or the recipe's batching
scheduler (static, dynamic, continuous)."""
from __future__ import annotations

import time

from experiments.serving.backends.served import ServedEngine
from experiments.serving.batching import BatchingServer
from experiments.serving.continuous import ContinuousServer
from experiments.serving.encoder_batching import EncoderBatchServer
from experiments.serving.engine import Engine
from experiments.serving.iteration import IterationServer
from experiments.serving.queue_server import QueueServer, Server


class SequentialServer(QueueServer):
    """A FIFO request queue in front of one engine that serves one request at a time (no batching)."""
    close_timeout_s = 30.0

    def __init__(self, engine: Engine):
        super().__init__()
        self.engine = engine
        self._start()

    def _serve(self) -> None:
        while (rec := self._queue.get()) is not None:
            if rec.cancelled:
                rec.done.set()
                continue
            rec.engine_start = time.perf_counter()
            try:
                for token, compute in self.engine.generate(list(rec.prompt.token_ids), rec.prompt.max_new_tokens):
                    rec.token_times.append(time.perf_counter())
                    rec.tokens.append(token)
                    rec.model_s += compute
                    if rec.cancelled:
                        break
            except Exception as exc:  # an engine failure is a request error, counted and reported
                rec.error = f"{type(exc).__name__}: {exc}"
            rec.done.set()


SERVED_REQUEST_TIMEOUT_S = 300.0


def serve(engine: Engine) -> Server:
    """The server for the engine's recipe: one request at a time, or a batching scheduler; for a serving engine,
    our endpoint client in front of its own server (which schedules and batches by itself)."""
    if isinstance(engine, ServedEngine):
        return engine.endpoint(SERVED_REQUEST_TIMEOUT_S)
    recipe = getattr(engine, "recipe", None)
    if recipe is None or recipe.batching == "none":
        return SequentialServer(engine)
    if not engine.decodes:
        if recipe.batching not in ("static", "dynamic"):
            raise ValueError(f"an encoder batches statically or dynamically, not {recipe.batching!r}")

        return EncoderBatchServer(engine, recipe.max_batch, recipe.max_wait_ms)
    if recipe.batching == "continuous" and engine.name == "torch":
        if recipe.scheduler == "own":
            if recipe.prefix_caching:
                raise ValueError("prefix caching needs transformers' paged KV cache; the own scheduler has none")
            return IterationServer(engine, recipe.max_batch, recipe.max_tokens_per_step)
        if recipe.scheduler != "transformers":
            raise ValueError(f"unknown continuous scheduler {recipe.scheduler!r}; known: transformers, own")
        return ContinuousServer(engine, recipe.max_tokens_per_step, recipe.kv_block_size, recipe.kv_num_blocks,
                                recipe.prefix_caching)

    return BatchingServer(engine, recipe.batching, recipe.max_batch, recipe.max_wait_ms)
