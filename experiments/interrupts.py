"""Ctrl-C during a sweep: the first finishes the current step and records it, the second stops at once."""
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


def exit_on_sigterm() -> None:
    """SIGTERM (kill, timeout, a CI runner's cancel) unwinds the main thread as SystemExit(143), so that what
    this process started is ended on the way out (experiments/isolation.py's children, stopped residents
    included). Its default action ends this process alone and leaves them behind."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)


def _exit(signum, frame) -> None:
    raise SystemExit(128 + signum)
