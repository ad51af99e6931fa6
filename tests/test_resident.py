"""isolation.Resident: a contender built once in a process of its own, stopped while its rival runs (issue 16)."""
import contextlib
import functools
import time

import pytest

from experiments.measure import isolation

LIMITS = isolation.Limits(time_s=60, memory_bytes=2**33, poll_s=0.05)


def _ticking(path):
    """Built once: a thread that writes the time to `path` every 10 ms, left running between calls."""
    import os
    import threading

    def tick():
        fresh = path.with_suffix(".new")
        while True:
            # written aside and renamed: a stop between write_text's truncate and its write would leave ''
            fresh.write_text(repr(time.monotonic()))
            os.replace(fresh, path)
            time.sleep(0.01)
    threading.Thread(target=tick, daemon=True).start()
    return path


def _last_tick(path, wait_s):
    time.sleep(wait_s)
    return float(path.read_text())


def _nothing():
    return None


def _boom(built):
    raise ValueError("broken engine")


def test_a_resident_runs_only_during_its_calls(tmp_path):
    ticks = tmp_path / "ticks"
    with isolation.Resident(functools.partial(_ticking, ticks), LIMITS, tmp_path / "resident.log") as child:
        assert child.call(_last_tick, 0.1) > 0
        stopped_at = float(ticks.read_text())
        time.sleep(0.5)             # the rival's turn: the child is stopped, its thread too
        assert float(ticks.read_text()) == stopped_at
        during = child.call(_last_tick, 0.1)     # running again while called
        assert during > stopped_at + 0.4


def test_a_resident_that_breaks_says_why(tmp_path):
    with isolation.Resident(_nothing, LIMITS, tmp_path / "resident.log") as child:
        with pytest.raises(isolation.ResidentFailed, match="exited with code 1|ValueError"):
            child.call(_boom)


def test_a_resident_is_gone_once_closed(tmp_path):
    child = isolation.Resident(_nothing, LIMITS, tmp_path / "resident.log")
    pid = child.child.pid
    child.close()
    import psutil
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


SIGTERMED = """
import sys, time
from pathlib import Path
from experiments.measure import isolation
from experiments.core.interrupts import Terminated, exit_on_sigterm
from tests.test_resident import LIMITS, _nothing

if sys.argv[1] == "handled":
    exit_on_sigterm()
try:
    with isolation.Resident(_nothing, LIMITS, Path(sys.argv[2])) as child:
        print(child.child.pid, flush=True)
        time.sleep(120)
except Terminated:
    sys.exit(143)
"""


@pytest.mark.parametrize("handled", [True, False])
def test_a_sigterm_ends_the_stopped_residents(tmp_path, handled):
    """SIGTERM (a timeout, a CI cancel) to a process holding a stopped resident: with exit_on_sigterm, as
    roi-ladder and make bench-gate install it, the resident is ended on the way out. Without it the resident
    stays stopped for ever (its parent, the fork server, lives on): the case this guards against."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-c", SIGTERMED, "handled" if handled else "default",
                             str(tmp_path / "resident.log")], cwd=root, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)}, start_new_session=True)
    resident = None
    try:
        resident = psutil.Process(int(proc.stdout.readline()))
        time.sleep(0.5)
        assert resident.status() == psutil.STATUS_STOPPED
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == (143 if handled else -signal.SIGTERM)
        gone = psutil.wait_procs([resident], timeout=10)[0]
        if handled:
            assert gone, "the resident outlived the SIGTERMed process"
        else:
            assert not gone and resident.status() == psutil.STATUS_STOPPED
    finally:
        for group in {proc.pid, resident and os.getpgid(resident.pid) if resident and resident.is_running() else None} - {None}:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def test_a_sigterm_exits_143_where_ctrl_c_exits_130():
    from experiments import cli
    from experiments.core.interrupts import Terminated

    def raises(exc):
        def work():
            raise exc
        return work
    assert cli.guarded(raises(Terminated())) == 143
    assert cli.guarded(raises(KeyboardInterrupt())) == 130
