"""Ctrl-C during a sweep: the first finishes the current step and records it, the second stops at once."""
from __future__ import annotations

import signal
import threading


class GracefulStop:
    def __init__(self, note):
        self.note, self.requested, self._previous = note, False, None

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():   # launchers may run a job in a thread
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.note("Ctrl-C: finishing the current step and recording it, then stopping (Ctrl-C again stops at once)")
