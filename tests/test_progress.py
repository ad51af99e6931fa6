"""Progress and what remains (experiments/core/progress.py), as a stage shows it and as a measuring child relays it."""
import io
import multiprocessing
import threading

import pytest
from rich.console import Console

from experiments.core import progress
from experiments.core.progress import Estimate, Tracker, duration, sweep_text
from experiments.measure import isolation
from experiments.record import console as console_module
from experiments.record.console import Stage, SweepConsole


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("estimate,remaining", [
    (Estimate(2, 8, 10.0, 10.0), 30.0),                   # 5 s per unit seen, 6 units left
    (Estimate(2, 8, 13.0, 10.0), 27.0),                   # 3 s into the third unit
    (Estimate(2, 8, 40.0, 10.0), 25.0),                   # the third overran: the 5 after it still remain
    (Estimate(0, 8, 3.0, 0.0, planned_s=16.0), 14.0),     # nothing done yet: the plan's 2 s per unit
    (Estimate(0, 8, 30.0, 0.0, planned_s=16.0), None),    # nothing done and the plan overrun: it was wrong
    (Estimate(11, 101, 12.0, 12.0, first_done=1, first_done_s=2.0), 90.0),   # 1 s per unit after a 2 s start-up
    (Estimate(8, 8, 50.0, 50.0), 0.0),
    (Estimate(0, 8, 3.0), None),                          # no plan, no unit done: no number to give
    (Estimate(3, None, 9.0, 9.0), None),                  # no total
    (Estimate(3, 8, 0.0, 0.0), None),                     # units relayed all at once: no rate yet
])
def test_remaining_time_has_known_answers(estimate, remaining):
    assert estimate.remaining_s == remaining


def test_estimate_text_shows_done_of_total_and_what_remains():
    assert Estimate(2, 8, 10.0, 10.0).text("levels") == "2/8 levels · 10 s in · about 30 s left"
    assert Estimate(0, 8, 3.0).text() == "0/8 · 3 s in · no estimate yet"
    assert Estimate(0, 2, 41.0, planned_s=2.0).text("levels") == \
        "0/2 levels · 41 s in · longer than the planned 2 s, no estimate until one is done"
    assert Estimate(4, 8, 10.0, 10.0).fraction == 0.5
    assert duration(42) == "42 s" and duration(300) == "5 min" and duration(7200) == "2.0 h"


def test_a_tracker_starts_a_new_count_and_clock_for_new_work():
    clock = Clock()
    t = Tracker(clock)
    t.progress(0, 4, "levels", planned_s=20)
    clock.now += 6
    t.progress(1)
    clock.now += 2
    est = t.estimate()
    assert (est.done, est.total, est.elapsed_s, est.last_done_s) == (1, 4, 8, 6) and est.remaining_s == 16
    t.progress(5)                                      # an SLA search measured a level more than planned
    assert t.total == 5
    t.progress(0, 100, "loglikelihood", "requests")
    clock.now += 5
    t.progress(1)                                      # a first batch's start-up ...
    clock.now += 3
    t.progress(31)                                     # ... left out of the rate: 0.1 s per request
    assert t.text() == "loglikelihood: 31/100 requests · 8 s in · about 7 s left"


def test_the_sweep_line_says_rung_k_of_n_and_an_upper_estimate():
    assert sweep_text(1, 15, [], 0) == "rung 1 of 15"
    assert sweep_text(3, 15, [20.0, 40.0], 2) == ("rung 3 of 15 · 2 measured so far, 30 s each · up to about "
                                                  "6 min left (a rung that does not apply here takes none)")


def test_a_stage_shows_done_of_total_and_an_estimate_live_and_in_a_log(monkeypatch):
    clock = Clock()
    st = Stage("baseline: load ladder", Console(file=io.StringIO()), clock=clock)
    clock.now += 12
    assert st.describe() == "baseline: load ladder\n  12 s in"          # nothing counted yet: the time so far
    clock.now = 100.0
    st.progress(0, 4, "levels", planned_s=20)
    clock.now += 3
    assert st.describe() == "baseline: load ladder\n  levels: 0/4 · 3 s in · about 17 s left"   # counts down
    clock.now += 3
    st.progress(2)
    assert "levels: 2/4 · 6 s in · about 6 s left" in st.describe()

    monkeypatch.setattr(console_module, "LOG_EVERY_S", 0.0)
    log = io.StringIO()
    ui = SweepConsole(Console(file=log, width=200))               # not a terminal: lines, not a live display
    with ui.stage("int8: soak") as st:
        st.progress(0, 8, "soak", "windows of 1 s", planned_s=8)
        st.progress(3)
    assert "int8: soak — soak: 3/8 windows of 1 s" in log.getvalue() and "left" in log.getvalue()


def test_a_measuring_childs_stages_and_counts_reach_the_parents_display():
    receiver, sender = multiprocessing.Pipe(duplex=False)
    progress.connect(sender)
    try:
        child = SweepConsole(Console(file=io.StringIO(), force_terminal=True), relay=True)
        threads = threading.active_count()
        with child.stage("baseline: lm-eval") as st:
            assert threading.active_count() == threads     # no display thread beside a measurement
            st.progress(0, 10, "loglikelihood", "requests")
            st.progress(10)                                   # the last unit always goes up
    finally:
        progress.connect(None)
    parent = Stage("baseline: build, load ladder and scores", Console(file=io.StringIO()))
    while receiver.poll(0):
        kind, message = receiver.recv()
        assert kind == "progress"
        parent.relayed(message)
    assert "baseline: lm-eval — loglikelihood: 10/10 requests" in parent.describe()
    assert "about 0 s left" in parent.describe()


def count_to(n):
    ui = SweepConsole(Console(file=io.StringIO()), relay=True)
    with ui.stage("counting") as st:
        for i in range(n + 1):
            st.progress(i, n, "units")
    return n


def test_isolation_run_hands_a_childs_progress_to_on_progress(tmp_path):
    seen = []
    out = isolation.run(count_to, (50,), isolation.Limits(60, 3 * 2**30, 0.1), tmp_path / "p.log",
                        on_progress=seen.append)
    assert out.value == 50 and out.failure is None
    assert seen[0] == ("stage", "counting")
    assert seen[-1][:3] == ("progress", 50, 50)    # throttled in between, never the last
    assert len(seen) < 10


def test_one_count_of_thousands_is_no_rate():
    # lm-eval's first request of 3,200 came 11 s in (start-up): that once read "about 9.9 h left"
    first = Estimate(done=1, total=3200, elapsed_s=11, last_done_s=11, first_done=1, first_done_s=11)
    assert first.remaining_s is None and "no estimate yet" in first.text("requests")
    later = Estimate(done=101, total=3200, elapsed_s=21, last_done_s=21, first_done=1, first_done_s=11)
    assert later.remaining_s == pytest.approx(0.1 * 3099)
