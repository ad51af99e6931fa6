"""Ctrl-C during a sweep: the first finishes the current step and records it, the second stops at once;
SIGTERM as the second."""
from __future__ import annotations

import os
import signal
import threading

NOTE = b"\n  Ctrl-C: finishing the current step and recording it, then stopping (Ctrl-C again stops at once)\n"


class GracefulStop:
    def __init__(self):
        self.requested, self._previous = False, None

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
        os.write(2, NOTE)   # not through the console: this may interrupt one of its writes


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, timeout, a CI runner's cancel), handled wherever a second Ctrl-C is: the runs it interrupts
    are marked KILLED, what this process started (experiments/measure/isolation.py's children, stopped residents
    included) is ended on the way out, and the command exits 143. SIGTERM's default action ends this process
    alone and leaves them behind."""


def exit_on_sigterm() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum, frame) -> None:
    raise Terminated
