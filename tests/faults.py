"""Rungs that break the way real ones do (tests only): a segfault, a memory blow-up, a hang, and a contender that
disturbs the process it is built in."""
import ctypes
import threading
import time

from experiments.serving.torch_engine import TorchEngine
from optimizers.base import Optimizer


def segfault():
    ctypes.string_at(0)          # reads address 0: SIGSEGV, as a broken native kernel would


def hog_memory(step_mb: int = 256):
    keep = []
    while True:                  # grows until something stops it
        keep.append(bytearray(step_mb * 2**20))
        time.sleep(0.02)


def hang():
    while True:
        time.sleep(1)


class Segfault(Optimizer):
    cost = "zero"

    def apply(self, cand):
        segfault()


class MemoryHog(Optimizer):
    cost = "zero"

    def apply(self, cand):
        hog_memory()


class Hang(Optimizer):
    cost = "zero"

    def apply(self, cand):
        hang()


# --- a contender that disturbs its process (issue 16) ------------------------------------------------------------
class DisturbingEngine(TorchEngine):
    """The eager torch engine, plus background work it leaves running in its process once built: threads that
    burn CPU (holding the GIL in pure Python) whenever no DisturbingEngine is generating, as a compiler's worker
    pool or a prefetcher might, yielding to its own requests and competing with everyone else's. Closing the
    engine does not stop them. Measured in a process of its own it is as fast as the engine it wraps; measured
    in a process shared with a rival, the rival is slowed and it looks faster."""
    name = "disturbing"

    def __init__(self, cand, threads):
        super().__init__(cand, threads)
        served = self._forward

        def forward(**kwargs):           # its own scoring (lm-eval, fidelity) also holds the burners back
            with _serving:
                return served(**kwargs)

        self._forward = forward
        _start_burners(2)

    def generate(self, prompt_ids, max_new_tokens):
        with _serving:
            yield from super().generate(prompt_ids, max_new_tokens)


class _Serving:
    """How many DisturbingEngine requests are in flight in this process; the burners wait while any are."""
    def __init__(self):
        self._busy = 0
        self._idle = threading.Condition()

    def __enter__(self):
        with self._idle:
            self._busy += 1

    def __exit__(self, *exc):
        with self._idle:
            self._busy -= 1
            self._idle.notify_all()

    def wait_idle(self):
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0)


_serving = _Serving()
_burners: list = []


def _start_burners(n):
    def burn():
        while True:
            _serving.wait_idle()
            until = time.perf_counter() + 0.005
            while time.perf_counter() < until:
                pass

    while len(_burners) < n:
        _burners.append(threading.Thread(target=burn, name="disturbing-burner", daemon=True))
        _burners[-1].start()


class Disturbing(Optimizer):
    """The champion's own recipe, served by DisturbingEngine: no real gain, so it must not be accepted."""
    cost = "zero"

    def apply(self, cand):
        return cand.edited("disturbing", engine="faults:DisturbingEngine")
