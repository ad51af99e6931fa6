"""make bench-gate's disturbing contender: it burns the cores while idle, never while it serves, and not after it
has been stopped until it has served again (its own run must not start on a machine it has just warmed)."""
import functools
import time

import psutil

from experiments.benchmarks.gate_contenders import DisturbingEngine
from experiments.measure import isolation

LIMITS = isolation.Limits(time_s=60, memory_bytes=2**33, poll_s=0.05)


class Sleepy:
    """An engine whose every step sleeps 1 ms: it uses no CPU of its own."""

    def generate(self, prompt_ids, max_new_tokens):
        for _ in range(max_new_tokens):
            time.sleep(0.001)
            yield 0, 0.001

    def close(self):
        pass


def _cpu_over(engine, seconds: float, serving: bool = False) -> float:
    """CPU seconds this process used over `seconds`, idle or serving one request after another."""
    before, until = psutil.Process().cpu_times(), time.perf_counter() + seconds
    while time.perf_counter() < until:
        if serving:
            list(engine.generate([1], 5))
        else:
            time.sleep(0.01)
    after = psutil.Process().cpu_times()
    return (after.user + after.system) - (before.user + before.system)


def _disturbing():
    return DisturbingEngine(Sleepy(), burners=2)


def test_it_burns_while_idle_and_not_while_serving():
    engine = _disturbing()
    assert _cpu_over(engine, 0.5, serving=True) < 0.15
    assert _cpu_over(engine, 0.6) > 0.15         # two burners; on a loaded machine, less than two cores


def test_once_stopped_it_waits_to_serve_before_burning_again(tmp_path):
    with isolation.Resident(_disturbing, LIMITS, tmp_path / "resident.log") as child:
        child.call(_cpu_over, 0.3, True)
        assert child.call(_cpu_over, 0.6) > 0.15  # idle after serving: it burns until stopped
        time.sleep(0.5)                           # stopped, as while a rival runs
        assert child.call(_cpu_over, 0.6) < 0.06  # continued: it waits for a request
        child.call(functools.partial(_cpu_over, seconds=0.05, serving=True))
        assert child.call(_cpu_over, 0.6) > 0.15
