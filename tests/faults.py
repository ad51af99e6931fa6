"""Rungs that break the way real ones do (tests only): a segfault, a memory blow-up, a hang, and a contender that
disturbs the process it is built in."""
import ctypes
import threading
import time

from experiments.serving.backends.pytorch.causal_lm import TorchEngine
from optimizers.base import Optimizer
from optimizers.baseline import EagerBaseline


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


class FailingBaseline(EagerBaseline):
    """A baseline that cannot be built: the sweep has no champion."""

    def apply(self, cand):
        raise RuntimeError("scripted baseline failure: the model does not load")


# --- a contender that disturbs its process (issue 16) ------------------------------------------------------------
class DisturbingEngine(TorchEngine):
    """The eager torch engine, plus background work it leaves running in its process once built: threads that burn
    CPU (holding the GIL in pure Python) while another torch engine in the same process is generating, and never
    otherwise; closing the engine does not stop them. Alone in a process it is the engine it wraps, idle threads
    aside; sharing a process with a rival, the rival is slowed and it looks faster. (An earlier version burned
    whenever it was not itself serving: alone in its process it then measured 37 % faster than the eager
    champion on this loaded 2-core machine, for reasons not found, so that version could not tell the designs
    apart.)"""
    name = "disturbing"

    def __init__(self, cand, threads, artefact_root=None):
        super().__init__(cand, threads)
        _watch_rivals()
        _start_burners(2)


class _Rivals:
    """How many other torch engines' requests are in flight in this process; the burners wait while none are."""
    def __init__(self):
        self._running = 0
        self._changed = threading.Condition()

    def __enter__(self):
        with self._changed:
            self._running += 1
            self._changed.notify_all()

    def __exit__(self, *exc):
        with self._changed:
            self._running -= 1

    def wait_for_one(self):
        with self._changed:
            self._changed.wait_for(lambda: self._running > 0)


_rivals = _Rivals()
_burners: list = []


def _watch_rivals():
    """Wraps TorchEngine.generate so a rival's requests (any torch engine but this one) are counted."""
    if getattr(TorchEngine.generate, "watched", False):
        return
    plain = TorchEngine.generate

    def generate(self, prompt_ids, max_new_tokens):
        if isinstance(self, DisturbingEngine):
            yield from plain(self, prompt_ids, max_new_tokens)
            return
        with _rivals:
            yield from plain(self, prompt_ids, max_new_tokens)

    generate.watched = True
    TorchEngine.generate = generate


def _start_burners(n):
    def burn():
        while True:
            _rivals.wait_for_one()
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
