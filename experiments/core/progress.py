"""Progress and what remains: counted work with an estimate from the plan or the rate seen so far, and the relay
that carries a measuring child's progress to the process that shows it.

The estimate is only ever work known up front (levels, rounds, requests, soak seconds, training steps) times a
time per unit: the plan's until the first unit is done, the observed one after. The relay is a message on the
child's result pipe, sent at most every RELAY_EVERY_S, so a measurement pays a counter and a clock read at most.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

RELAY_EVERY_S = 0.5


@dataclass(frozen=True)
class Estimate:
    """done of total units, elapsed_s since the work began, the last count seen at last_done_s, the first
    count above zero (first_done) at first_done_s."""
    done: float
    total: float | None
    elapsed_s: float
    last_done_s: float = 0.0
    planned_s: float | None = None     # the whole work's expected length, used until a unit is done
    first_done: float = 0.0
    first_done_s: float = 0.0

    @property
    def per_unit_s(self) -> float | None:
        """The rate between the first count and the last, which leaves out start-up (a first batch, a warm-up);
        with one count only, the time since the start when that count is a tenth of the work or more (one
        lm-eval request of 3,200 carries the start-up: 11 s of it read as "9.9 h left"), else the plan's
        while it holds."""
        if self.done > self.first_done > 0 and self.last_done_s > self.first_done_s:
            return (self.last_done_s - self.first_done_s) / (self.done - self.first_done)
        if self.done > 0 and self.last_done_s > 0 and self.total and self.done >= 0.1 * self.total:
            return self.last_done_s / self.done         # units seen in no time (relayed late) show no rate
        if self.planned_s is not None and self.total and self.elapsed_s <= self.planned_s:
            return self.planned_s / self.total
        return None                                    # too little seen, or nothing done and the plan overrun

    @property
    def remaining_s(self) -> float | None:
        """Units left times the time per unit, less what the current unit has run already; never below the
        units after the current one, so a unit that overruns does not count the rest down to nothing."""
        if self.total is None:
            return None
        left = max(self.total - self.done, 0.0)
        if left == 0:
            return 0.0
        per = self.per_unit_s
        if per is None:
            return None
        running = max(self.elapsed_s - self.last_done_s, 0.0)
        return max(per * left - running, per * max(left - 1, 0.0))

    @property
    def fraction(self) -> float | None:
        return min(self.done / self.total, 1.0) if self.total else None

    def text(self, unit: str = "") -> str:
        parts = [f"{self.done:g}/{self.total:g}{' ' + unit if unit else ''}" if self.total is not None
                 else (f"{self.done:g}{' ' + unit if unit else ''}" if self.done else "")]
        parts.append(f"{self.elapsed_s:.0f} s in")
        left = self.remaining_s
        if left is not None:
            parts.append(f"about {duration(left)} left")
        elif self.planned_s is not None and self.done == 0:
            parts.append(f"longer than the planned {duration(self.planned_s)}, no estimate until one is done")
        else:
            parts.append("no estimate yet")
        return " · ".join(p for p in parts if p)


def duration(seconds: float) -> str:
    if seconds < 100:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5940 else f"{seconds / 3600:.1f} h"


class Tracker:
    """One stage's counted work: `progress` starts a new piece of work when `what` changes."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self.what, self.unit, self.planned_s = "", "", None
        self.done, self.total = 0.0, None
        self._started = self._last_done = self._first_done_at = None
        self._first_done = 0.0

    def progress(self, done: float, total: float | None = None, what: str | None = None, unit: str | None = None,
                 planned_s: float | None = None) -> None:
        now = self._clock()
        if self._started is None or (what is not None and what != self.what):
            self.what, self.unit, self.planned_s = what or self.what, unit or "", planned_s
            # _started last: the display's thread reads the rest once it is set
            self.done, self.total, self._last_done, self._first_done, self._first_done_at = 0.0, None, now, 0.0, now
            self._started = now
        if unit is not None:
            self.unit = unit
        if planned_s is not None:
            self.planned_s = planned_s
        if total is not None:
            self.total = float(total)
        if done != self.done:
            self.done, self._last_done = float(done), now
            if self._first_done == 0:
                self._first_done, self._first_done_at = self.done, now
        if self.total is not None and self.done > self.total:   # e.g. an SLA search measures extra levels
            self.total = self.done

    @property
    def active(self) -> bool:
        return self._started is not None

    def estimate(self) -> Estimate | None:
        if self._started is None:
            return None
        now = self._clock()
        return Estimate(self.done, self.total, now - self._started, self._last_done - self._started, self.planned_s,
                        self._first_done, self._first_done_at - self._started)

    def text(self) -> str:
        est = self.estimate()
        if est is None:
            return ""
        return f"{self.what}: {est.text(self.unit)}" if self.what else est.text(self.unit)


def sweep_text(position: int, rungs: int, measured_s: list[float], done: int) -> str:
    """'rung k of n' with what remains: the rungs measured so far took measured_s each; skipped ones take none,
    so the rungs left, times the mean, is an upper estimate."""
    head = f"rung {position} of {rungs}"
    if not measured_s:
        return head
    mean = sum(measured_s) / len(measured_s)
    left = (rungs - done) * mean
    return (f"{head} · {len(measured_s)} measured so far, {duration(mean)} each · up to about {duration(left)} "
            f"left (a rung that does not apply here takes none)")


# --- the relay, in a child of experiments/measure/isolation.py ----------------------------------------------------------
_channel = None
_lock = threading.Lock()
_last_sent = 0.0


def connect(sender) -> None:
    """In a measuring child: progress goes up this pipe (isolation.run reads it beside the result)."""
    global _channel
    _channel = sender


def relaying() -> bool:
    return _channel is not None


def send(message, *, urgent: bool = False) -> None:
    """Sent when urgent (a new stage, a new piece of work, the last unit) or RELAY_EVERY_S after the last.
    Callers count between measured windows (load levels, soak windows, rounds), never inside one."""
    global _last_sent
    if _channel is None:
        return
    now = time.monotonic()
    if not urgent and now - _last_sent < RELAY_EVERY_S:
        return
    _last_sent = now
    _post("progress", message)


def started_child(pid: int) -> None:
    """A measuring child started one of its own, which the fork server forked (experiments/measure/isolation.py): its id
    goes up, so that it counts towards the limits of this child and is ended with it."""
    if _channel is not None:
        _post("child", pid)


def _post(kind: str, value) -> None:
    with _lock:
        try:
            _channel.send((kind, value))
        except (OSError, ValueError):
            pass          # the parent is gone or the pipe closed: never worth failing for


def send_result(message) -> None:
    """The child's result, on the same pipe: never interleaved with a progress message."""
    with _lock:
        _channel.send(message)
