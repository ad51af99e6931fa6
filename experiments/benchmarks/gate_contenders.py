"""make bench-gate's test-only contenders (experiments/benchmarks/gate_quality.py): the champion's own engine,
slowed by a known share, or leaving CPU-burning threads behind in its process."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from experiments.serving import build_engine
from experiments.serving.engine import Engine


class Wrapped(Engine):
    """Another engine, generating through `generate` below; scoring and artefacts are the inner engine's."""

    def __init__(self, inner: Engine):
        self.inner = inner

    def lm_eval_model(self, batch_size):
        return self.inner.lm_eval_model(batch_size)

    def artefact_paths(self):
        return self.inner.artefact_paths()

    def close(self):
        self.inner.close()


class SlowedEngine(Wrapped):
    """Every request takes `extra` x its own measured compute longer: each step's share is owed, and paid as one
    sleep before the request's last token.

    Measured here, both ways of paying per step inject far more than asked: a busy-wait competes with ONNX
    Runtime's own threads for the 2 cores (a 10 % spin came out at +15-30 %), and a sleep between steps costs
    a wake-up of its thread pool on the next step besides its oversleep (sleeping every ~1 ms came out at
    +40 %). One sleep per request costs one such wake-up per ~16 ms request.
    """

    name = "slowed"

    def __init__(self, inner: Engine, extra: float):
        super().__init__(inner)
        self.extra = extra

    def generate(self, prompt_ids, max_new_tokens):
        owed = 0.0
        for step, (token, compute) in enumerate(self.inner.generate(prompt_ids, max_new_tokens), 1):
            owed += self.extra * compute
            slept = 0.0
            if step == max_new_tokens:
                started = time.perf_counter()
                time.sleep(owed)
                slept = time.perf_counter() - started
            yield token, compute + slept


class DisturbingEngine(Wrapped):
    """The engine it wraps, plus threads it starts once built and never stops: they burn the machine's cores
    (numpy matrix products, which release the GIL) once it has served nothing for IDLE_S, and sleep on a
    condition while it serves. Beside a rival that runs while it idles (one process, or its process not stopped)
    the rival is slowed and it looks faster; measured apart, stopped while the other side runs, it is the engine
    it wraps, as near as this machine allows: burners that polled every 2 ms while it served made it read 1-9 %
    faster than that engine under conf/gate's 20 x 1 s rounds, and threads that do nothing but wake every 2 ms
    read 0.89-1.02 (median 0.94, 10 trials): waking threads speed this VM up, for reasons not found."""

    name = "disturbing"
    IDLE_S = 0.05     # longer than the gap between one request and the next of a run: its own run is not slowed
    BURST_S = 0.01    # burnt between checks that it is still idle

    def __init__(self, inner: Engine, burners: int):
        super().__init__(inner)
        self._in_flight, self._last = 0, time.perf_counter()
        self._changed = threading.Condition()
        for _ in range(burners):
            threading.Thread(target=self._burn, daemon=True, name="disturbing-burner").start()

    def generate(self, prompt_ids, max_new_tokens):
        with self._changed:
            self._in_flight += 1
        try:
            yield from self.inner.generate(prompt_ids, max_new_tokens)
        finally:
            with self._changed:
                self._in_flight -= 1
                self._last = time.perf_counter()
                self._changed.notify_all()

    def _wait_until_idle(self) -> None:
        """Return, without waking before, once it has served nothing for IDLE_S."""
        with self._changed:
            while True:
                if self._in_flight:
                    self._changed.wait()
                    continue
                left = self.IDLE_S - (time.perf_counter() - self._last)
                if left <= 0:
                    return
                self._changed.wait(left)

    def _burn(self):
        a = np.random.default_rng(0).standard_normal((192, 192))
        while True:
            self._wait_until_idle()
            until = time.perf_counter() + self.BURST_S
            while time.perf_counter() < until and not self._in_flight:
                a = np.tanh(a @ a)   # ~1 ms of a core per product; tanh keeps the values finite


def slowed_build(cand, threads: int, artefacts: Path, extra: float) -> SlowedEngine:
    return SlowedEngine(build_engine(cand, threads, artefacts), extra)


def disturbing_build(cand, threads: int, artefacts: Path) -> DisturbingEngine:
    return DisturbingEngine(build_engine(cand, threads, artefacts), burners=threads)
