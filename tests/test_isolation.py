"""experiments/measure/isolation.py on real faults: each becomes a reason, the caller goes on, nothing is left running."""
import multiprocessing.forkserver
import os
import signal
import time
from pathlib import Path

import faults
import psutil
import pytest
from omegaconf import OmegaConf

from experiments.core.errors import ConfigError
from experiments.measure import isolation

LIMITS = isolation.Limits(time_s=20, memory_bytes=3 * 2**30, poll_s=0.1)


def double(x):
    return 2 * x


def refuse():
    raise ConfigError("rung setting x is bad", "set it to y")


def report_pid_then_hang(path):
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    faults.hang()


def test_a_value_comes_back(tmp_path):
    out = isolation.run(double, (21,), LIMITS, tmp_path / "ok.log")
    assert out.value == 42 and out.failure is None and out.peak_rss_bytes >= 0


def run_a_child_of_its_own(log_dir):
    inner = isolation.run(report_parent, (), LIMITS, Path(log_dir) / "inner.log")
    return inner.value, os.getppid(), multiprocessing.forkserver._forkserver._forkserver_pid


def report_parent():
    return os.getppid()


def test_a_childs_own_children_come_from_the_same_fork_server(tmp_path):
    """A fork server of the child's own imported torch and lm-eval once more per rung (~5 s of a core here),
    and outlived it, read as other work on the machine when the next rung started."""
    out = isolation.run(run_a_child_of_its_own, (str(tmp_path),), LIMITS, tmp_path / "outer.log")
    inner_parent, outer_parent, own_server = out.value
    assert inner_parent == outer_parent and own_server is None


def hold_then_run_a_child_that_holds(gib, pid_file, log_dir):
    held = bytearray(b"x") * int(gib * 2**30)
    inner = isolation.run(hold, (gib, pid_file), isolation.Limits(60, int(1.5 * 2**30), 0.1),
                          Path(log_dir) / "inner.log")
    return len(held), inner.failure


def hold(gib, pid_file):
    Path(pid_file).write_text(str(os.getpid()))
    held = bytearray(b"x") * int(gib * 2**30)
    time.sleep(30)
    return len(held)


def test_a_childs_own_children_count_towards_its_memory_limit_and_end_with_it(tmp_path):
    pid_file = tmp_path / "inner.pid"
    limits = isolation.Limits(time_s=60, memory_bytes=int(1.5 * 2**30), poll_s=0.1)
    out = isolation.run(hold_then_run_a_child_that_holds, (0.8, str(pid_file), str(tmp_path)), limits,
                        tmp_path / "outer.log")
    assert out.failure and out.failure.startswith("memory limit hit"), out
    inner = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(inner):
        assert time.monotonic() < deadline, "the child's own child outlived it"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:      # gone between the look-up and the reading
        return False


def test_a_segfault_is_a_reason_with_the_stack(tmp_path):
    out = isolation.run(faults.segfault, (), LIMITS, tmp_path / "segv.log")
    assert out.value is None
    assert "SIGSEGV (segmentation fault)" in out.failure
    assert "last log lines" in out.failure and "segfault" in out.failure   # faulthandler's stack names the function


def test_a_memory_blowup_hits_the_limit(tmp_path):
    limits = isolation.Limits(time_s=60, memory_bytes=int(1.5 * 2**30), poll_s=0.1)
    out = isolation.run(faults.hog_memory, (), limits, tmp_path / "hog.log")
    assert out.failure.startswith("memory limit hit") and "1.50 GiB" in out.failure
    assert out.peak_rss_bytes > 1.5 * 2**30


def test_a_hang_hits_the_time_limit_and_the_child_is_gone(tmp_path):
    started = time.monotonic()
    pid_file = tmp_path / "pid"
    out = isolation.run(report_pid_then_hang, (str(pid_file),), isolation.Limits(3, 2**32, 0.1), tmp_path / "h.log")
    assert out.failure.startswith("time limit hit: still running after 3 s")
    assert 3 <= time.monotonic() - started < 40
    assert not psutil.pid_exists(int(pid_file.read_text())) or \
        psutil.Process(int(pid_file.read_text())).status() == psutil.STATUS_ZOMBIE


def test_bad_input_found_in_the_child_is_raised_again(tmp_path):
    with pytest.raises(ConfigError, match="rung setting x is bad. set it to y"):
        isolation.run(refuse, (), LIMITS, tmp_path / "cfg.log")


def test_a_second_ctrl_c_ends_the_child_at_once(tmp_path):
    pid_file = tmp_path / "pid"

    def interrupt_soon(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt_soon)
    signal.setitimer(signal.ITIMER_REAL, 8)
    try:
        with pytest.raises(KeyboardInterrupt):
            isolation.run(report_pid_then_hang, (str(pid_file),), LIMITS, tmp_path / "int.log")
    finally:
        signal.signal(signal.SIGALRM, previous)
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_limits_come_from_conf_with_per_rung_overrides():
    cfg = OmegaConf.create({"time_limit_s": 3600, "memory_limit_gb": None, "memory_fraction": 0.5, "poll_s": 0.2,
                            "rungs": {"distillation": {"time_limit_s": 7200, "memory_limit_gb": 16}}})
    default, own = isolation.Limits.for_rung(cfg, "int8"), isolation.Limits.for_rung(cfg, "distillation")
    assert default.time_s == 3600 and default.memory_bytes == int(0.5 * psutil.virtual_memory().total)
    assert own.time_s == 7200 and own.memory_bytes == 16 * 2**30


@pytest.mark.parametrize("change,message", [
    ({"time_limit_s": 0}, r"isolation.time_limit_s=0 is not a number > 0"),
    ({"memory_fraction": 1.5}, r"isolation.memory_fraction=1.5 is not a number in \(0, 1\]"),
    ({"rungs": {"int8": {"time_limit": 5}}}, "isolation.rungs.int8 has unknown keys"),
])
def test_bad_limits_are_refused(change, message):
    cfg = OmegaConf.create({"time_limit_s": 3600, "memory_limit_gb": None, "memory_fraction": 0.8, "poll_s": 0.2,
                            "rungs": {}, **change})
    with pytest.raises(ConfigError, match=message):
        isolation.check_config(cfg)


CALLER = """
import sys
from pathlib import Path
from experiments.measure import isolation
import faults
if __name__ == "__main__":
    isolation.run(faults.hang, (), isolation.Limits(600, 2**34, 0.2), Path(sys.argv[1]),
                  on_start=lambda pid: print(pid, flush=True))
"""


def test_a_sigkilled_caller_leaves_no_child_running(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    caller = subprocess.Popen([sys.executable, str(script), str(tmp_path / "h.log")], stdout=subprocess.PIPE,
                              text=True, env=env)
    child = int(caller.stdout.readline())
    assert psutil.pid_exists(child)
    caller.kill()
    caller.wait(10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and psutil.pid_exists(child) and \
            psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.2)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
