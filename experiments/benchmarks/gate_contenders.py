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
    (numpy elementwise loops, which release the GIL) once it has served nothing for IDLE_S. Beside a rival that
    runs while it idles (one process, or its process not stopped) the rival is slowed and it looks faster;
    measured apart, stopped while the other side runs, it should read as the engine it wraps.

    Threads that wake often make this VM serve faster: threads that do nothing but wake every 2 ms read 0.89-1.02
    against the plain engine (median 0.94, 10 trials of conf/gate's 20 x 1 s rounds), and burners woken at each
    request's end (the engine serves one request at a time) read 0.93-0.98 while they never burnt in the rounds.
    So the burners check every CHECK_S, whatever it serves, and once it has been stopped (a check far too late)
    they wait until it has served again, so that they do not burn just before its own run."""

    name = "disturbing"
    IDLE_S = 0.05     # longer than the gap between one request and the next of a run: its own run is not slowed
    CHECK_S = 0.05    # between checks that it has been idle for IDLE_S
    STOPPED_S = 0.2   # a loop this much later than it should be: the process was stopped (SIGSTOP)

    def __init__(self, inner: Engine, burners: int):
        super().__init__(inner)
        self._in_flight, self._last, self._resumed = 0, time.perf_counter(), False
        self._lock = threading.Lock()
        for _ in range(burners):
            threading.Thread(target=self._burn, daemon=True, name="disturbing-burner").start()

    def generate(self, prompt_ids, max_new_tokens):
        with self._lock:
            self._in_flight += 1
            self._resumed = False
        try:
            yield from self.inner.generate(prompt_ids, max_new_tokens)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._last = time.perf_counter()

    def _idle(self) -> bool:
        return not self._in_flight and not self._resumed and time.perf_counter() - self._last >= self.IDLE_S

    def _burn(self):
        a = np.random.default_rng(0).standard_normal(200_000)
        seen = time.perf_counter()
        while True:
            if self._idle():
                np.tanh(a, out=a)    # ~0.4 ms of a core, the GIL released; elementwise: no BLAS worker
                a *= 3.0             # threads, which spin on after their work, stopped or not
                pause = 0.0
            else:
                time.sleep(self.CHECK_S)
                pause = self.CHECK_S
            now = time.perf_counter()
            if now - seen - pause > self.STOPPED_S:
                self._resumed = True
            seen = now


def slowed_build(cand, threads: int, artefacts: Path, extra: float) -> SlowedEngine:
    return SlowedEngine(build_engine(cand, threads, artefacts), extra)


def disturbing_build(cand, threads: int, artefacts: Path) -> DisturbingEngine:
    return DisturbingEngine(build_engine(cand, threads, artefacts), burners=threads)
