"""experiments/serving/server_process.py against tests/fake_server.py: start-up timed and its failures named, the
whole process group paused, resumed and ended, nothing left behind."""
import contextlib
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from experiments.core.errors import ConfigError
from experiments.serving import server_process
from experiments.serving.server_process import ServerFailed, ServerProcess

FAKE = str(Path(__file__).with_name("fake_server.py"))
pytestmark = pytest.mark.timeout(30)     # a stop() that never ends the group would hang, not fail


def fake(tmp_path, *flags, **kwargs) -> ServerProcess:
    kwargs.setdefault("grace_s", 2.0)
    return ServerProcess([sys.executable, FAKE, "--port", "{port}", *flags], tmp_path / "server.log", **kwargs)


def group(pgid: int) -> list[psutil.Process]:
    """Every process of the group, zombies included (they keep their group id until reaped)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def group_ended(pgid: int) -> bool:
    """Right after stop(): nothing of the group runs and the server itself is reaped. Its orphans' zombies are
    init's to reap (this machine's took up to 2 s), so the group is then waited for to be empty."""
    statuses = {}
    for proc in group(pgid):
        with contextlib.suppress(psutil.Error):
            statuses[proc.pid] = proc.status()
    return (pgid not in statuses and set(statuses.values()) <= {psutil.STATUS_ZOMBIE}
            and wait_for(lambda: group(pgid) == []))


def answers(url: str, timeout_s: float = 2.0) -> int | None:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=timeout_s) as resp:
            return resp.status
    except OSError:
        return None


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_healthy_start_is_timed_and_logged(tmp_path):
    with fake(tmp_path, "--health-after", "0.8", health_path="/v1/models") as server:
        server.start(timeout_s=10)
        assert 0.8 <= server.startup_s < 5
        assert answers(server.url + "/v1/models") == 200 and server.alive() and server.died() is None
        assert os.getpgid(server.pid) == server.pid != os.getpgid(0)        # a process group of its own ...
        assert os.getsid(server.pid) == os.getsid(0)                        # ... in our session (see below)
        log = (tmp_path / "server.log").read_text()
        assert f"fake server starting on port {server.port}" in log and "loading the fake weights" in log


def test_an_exit_during_start_up_says_its_code_and_last_line_at_once(tmp_path):
    server = fake(tmp_path, "--exit-at-start", "3")
    began = time.monotonic()
    with pytest.raises(ServerFailed) as failed:
        server.start(timeout_s=30)
    assert time.monotonic() - began < 3                    # the exit is seen, not the 30 s timeout waited out
    message = str(failed.value)
    assert "exited with code 3 during start-up" in message
    assert message.rstrip().endswith("fatal: the fake model does not fit (exit 3)")
    assert str(tmp_path / "server.log") in message


def test_a_server_never_healthy_fails_at_the_timeout_with_its_last_lines(tmp_path):
    server = fake(tmp_path, "--never-healthy", "--spawn-child")
    began = time.monotonic()
    with pytest.raises(ServerFailed) as failed:
        server.start(timeout_s=1.5)
    assert 1.5 <= time.monotonic() - began < 6
    message = str(failed.value)
    assert "within 1.5 s" in message and server.health_url in message
    assert "loading the fake weights" in message and "spawned worker" in message
    assert group_ended(server.pid) and not server.alive()


def test_a_port_in_use_is_refused_before_starting(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = fake(tmp_path, port=port)
        with pytest.raises(ConfigError, match=f"port {port} .*already in use"):
            server.start(timeout_s=5)
    assert server.pid is None and not (tmp_path / "server.log").exists()


def test_a_given_free_port_is_the_one_served(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with fake(tmp_path, port=port) as server:
        server.start(timeout_s=10)
        assert server.url == f"http://127.0.0.1:{port}" and answers(f"{server.url}/health") == 200


def test_a_command_without_port_or_program_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"\{port\}"):
        ServerProcess([sys.executable, FAKE, "--port", "8000"], tmp_path / "server.log")
    with pytest.raises(ConfigError, match="not found"):
        ServerProcess(["/no/such/server", "--port", "{port}"], tmp_path / "server.log").start(timeout_s=5)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)      # under nohup: started through HUP_DEFAULT
    try:
        with pytest.raises(ConfigError, match="not found"):
            ServerProcess(["/no/such/server", "--port", "{port}"], tmp_path / "server.log").start(timeout_s=5)
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_stop_ends_the_whole_group_and_leaves_no_zombie(tmp_path):
    server = fake(tmp_path, "--spawn-child").start(timeout_s=10)
    pgid = server.pid
    assert wait_for(lambda: len(group(pgid)) == 2)         # the server and its worker
    server.stop()
    assert group_ended(pgid)                               # the worker too, and the server left no zombie
    assert server.died().code == -signal.SIGTERM
    server.stop()                                          # again: nothing to do, nothing raised


def test_a_server_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
    server = fake(tmp_path, "--spawn-child", "--ignore-term", grace_s=0.5).start(timeout_s=10)
    pgid = server.pid
    assert wait_for(lambda: len(group(pgid)) == 2)
    began = time.monotonic()
    server.stop()
    assert time.monotonic() - began >= 0.5
    assert group_ended(pgid) and server.died().code == -signal.SIGKILL


def test_an_exception_in_the_with_block_ends_the_group(tmp_path):
    with pytest.raises(RuntimeError, match="measurement failed"):
        with fake(tmp_path, "--spawn-child") as server:
            server.start(timeout_s=10)
            pgid = server.pid
            assert wait_for(lambda: len(group(pgid)) == 2)
            raise RuntimeError("measurement failed")
    assert group_ended(pgid)


def test_pause_stops_the_whole_group_and_resume_serves_again(tmp_path):
    with fake(tmp_path, "--spawn-child") as server:
        server.start(timeout_s=10)
        assert wait_for(lambda: len(group(server.pid)) == 2)
        server.pause()
        assert {p.status() for p in group(server.pid)} == {psutil.STATUS_STOPPED}
        assert answers(server.health_url, timeout_s=0.5) is None and server.alive()
        server.resume()
        assert answers(server.health_url) == 200
        assert psutil.STATUS_STOPPED not in {p.status() for p in group(server.pid)}


def test_stop_ends_a_paused_group(tmp_path):
    server = fake(tmp_path, "--spawn-child", grace_s=5).start(timeout_s=10)
    pgid = server.pid
    assert wait_for(lambda: len(group(pgid)) == 2)
    server.pause()
    began = time.monotonic()
    server.stop()
    assert time.monotonic() - began < 3 and group_ended(pgid)   # by SIGTERM, not at the 5 s grace's end


def test_died_reports_a_crash_during_a_measurement(tmp_path):
    with fake(tmp_path, "--crash-after", "0.5") as server:
        server.start(timeout_s=10)
        assert server.died() is None
        assert wait_for(lambda: server.died() is not None)
        ended = server.died()
        assert ended.code == 7 and ended.last_lines[-1] == "fake server: segfault in the fake kernel"
        assert "exited with code 7" in ended.describe() and not server.alive()
        # not reaped before stop(): its zombie keeps the group's id from naming anyone else's group
        assert psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE
    assert group_ended(server.pid)


def test_ctrl_c_during_start_up_ends_the_group(tmp_path, monkeypatch):
    seen = {}

    def interrupted(url, timeout_s):
        # as Ctrl-C would, once the server and its worker are up
        if len(group(seen.setdefault("pgid", server.pid))) == 2:
            raise KeyboardInterrupt
        return False

    monkeypatch.setattr(server_process, "_answers_200", interrupted)
    server = fake(tmp_path, "--never-healthy", "--spawn-child")
    with pytest.raises(KeyboardInterrupt):
        server.start(timeout_s=10)
    assert seen["pgid"] == server.pid and group_ended(server.pid)


STARTER = """
import signal, sys, time
if {nohup}:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)   # as nohup leaves it
from pathlib import Path
from experiments.serving.server_process import ServerProcess
server = ServerProcess([sys.executable, {fake!r}, "--port", "{{port}}"], Path({log!r}))
server.start(timeout_s=10)
if {paused}:
    server.pause()
print(server.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("nohup", [False, True])
@pytest.mark.parametrize("paused", [True, False])
def test_a_server_whose_starter_is_killed_does_not_live_on(tmp_path, paused, nohup):
    """SIGKILL leaves no atexit to run. Paused: the kernel ends a stopped group orphaned by its parent's death
    (SIGHUP, SIGCONT), which it does because the group is in our session. Running: a measuring child ends its
    servers when it sees the sweep die (isolation, server_process.kill_all); here the starter does it at exit.
    Under nohup (SIGHUP ignored, which exec would pass on) the server is started with SIGHUP at its default: a
    paused server that kept nohup's SIG_IGN was resumed by the kernel's SIGCONT and lived on, serving."""
    import subprocess

    code = STARTER.format(fake=FAKE, log=str(tmp_path / "server.log"), paused=paused, nohup=nohup)
    if not paused:
        code = code.replace("print(server.pid", "import signal; signal.signal(signal.SIGTERM, lambda *a: "
                                                "(__import__('experiments.serving.server_process', fromlist=['x'])"
                                                ".kill_all(), sys.exit(1)))\nprint(server.pid")
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pgid = int(starter.stdout.readline())
    assert group(pgid)
    starter.send_signal(signal.SIGKILL if paused else signal.SIGTERM)
    starter.wait()
    assert wait_for(lambda: group(pgid) == [], 10)      # ended, and reaped by init


def test_a_server_that_dies_names_the_first_error_it_logged_not_only_its_wrappers(tmp_path):
    """vLLM's defaults on this machine died with 'RuntimeError: Engine core initialization failed' in the log's
    tail; its cause ('ValueError: Available memory on node 0 ...') came first. The one-line reason carries it."""
    from experiments.serving.server_process import Ended

    log = tmp_path / "server.log"
    log.write_text("INFO starting\n(APIServer) WARNING [system_utils.py:255] Found ulimit of 20000: this can cause fd "
                   "limit errors like `OSError: [Errno 24] Too many open files`.\nTraceback (most recent call last):\n"
                   "  File \"cpu_worker.py\", line 83\n(VllmWorker-0) ERROR [multiproc_executor.py:953] ValueError: "
                   "Available memory on node 0 (20.57/23.54 GiB) on startup is less than desired\n"
                   "RuntimeError: Engine core initialization failed. See root cause above.\n")
    text = Ended(1, ("RuntimeError: Engine core initialization failed. See root cause above.",), log).describe(
        " during start-up")
    assert text.startswith("the server exited with code 1 during start-up (ValueError: Available memory on node 0 "
                           "(20.57/23.54 GiB) on startup is less than desired); the last lines of its log")
    log.write_text("INFO fine\n")
    assert Ended(3, ("INFO fine",), log).describe().startswith("the server exited with code 3; the last lines")
