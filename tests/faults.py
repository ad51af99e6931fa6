"""Rungs that break the way real ones do (for the isolation tests only): a segfault, a memory blow-up, a hang."""
import ctypes
import time

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
