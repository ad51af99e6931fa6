"""A serving engine's own server (vLLM's, llama.cpp's llama-server, ...) as a child process of the ladder.

The server runs in a process group of its own, so the whole group (an API server and the engine workers it
starts) is paused, resumed and ended by the group's id. The group stays in our session: should the ladder die
while the server is paused, the kernel finds a stopped, orphaned group and sends it SIGHUP and SIGCONT, which
end it; a measuring child that sees the sweep die ends the servers it started (kill_all). It listens on 127.0.0.1, on a port chosen here, and
its output goes to a log file kept as an artefact of the run. start() waits for its health URL to answer
HTTP 200 and records how long that took (`startup_s`: a deployment pays it at every start); a server that
exits meanwhile, or never answers, is one error with its exit code and the last lines of its log.

    with ServerProcess(["vllm", "serve", "m", "--host", "127.0.0.1", "--port", "{port}"], log_path) as server:
        server.start(timeout_s=600)
        ...                                  # requests to server.url; server.died() between measurements
"""
from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from experiments.core.errors import ConfigError

HOST = "127.0.0.1"        # no authentication on these servers: never reachable from other machines
POLL_S = 0.2
PROBE_TIMEOUT_S = 2.0
SETTLE_S = 5.0           # how long the group may take to act on SIGSTOP or SIGKILL
LOG_TAIL_LINES = 20
EXITED = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
# Under nohup, SIGHUP is ignored, and exec keeps an ignored signal ignored: a server orphaned while paused would
# then be resumed by the kernel's SIGCONT, not ended by its SIGHUP. The server is exec'd from this instead,
# with SIGHUP back to its default (a signal's disposition is reset only where it was caught, never where ignored).
HUP_DEFAULT = [sys.executable, "-I", "-S", "-c", "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                                                 "os.execvp(sys.argv[1], sys.argv[1:])"]
_LIVE: set[int] = set()   # process groups of the servers this process started and has not stopped
# A proxy from the environment (http_proxy) must not stand in for the server on 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerFailed(RuntimeError):
    """The server exited, or never became healthy, during start-up (or died while it served): its exit code and
    its log's last lines."""


@dataclass(frozen=True)
class Ended:
    """How the server's process ended: its exit code (negative: the signal that ended it), its log's last lines."""
    code: int
    last_lines: tuple[str, ...]
    log_path: Path

    def describe(self, when: str = "") -> str:
        how = f"died of {_signal_name(-self.code)}" if self.code < 0 else f"exited with code {self.code}"
        cause = _first_error(self.log_path)
        return f"the server {how}{when}{f' ({cause})' if cause else ''}; {_tail_text(self.last_lines, self.log_path)}"


class ServerProcess:
    """One server command: start(), stop() (also by `with` and at exit), pause()/resume(), alive(), died()."""

    def __init__(self, command: list[str], log_path: Path, *, port: int | None = None,
                 health_path: str = "/health", env: Mapping[str, str] | None = None, grace_s: float = 10.0):
        """`{port}` in the command's arguments becomes the port: `port`, or a free one when it is None. `env`:
        variables set for the server over this process's environment."""
        if not any("{port}" in arg for arg in command):
            raise ConfigError(f"the server command {command[:3]} ... has no {{port}} placeholder",
                              "pass its port as, e.g., --port {port}: the server must listen where it is polled")
        if not health_path.startswith("/"):
            raise ConfigError(f"health path {health_path!r} does not start with '/'",
                              "give it as /health or /v1/models, say")
        self.port = port if port is not None else _free_port()
        self.command = [arg.replace("{port}", str(self.port)) for arg in command]   # not format(): JSON args
        self.log_path, self.grace_s = Path(log_path), grace_s
        self.url = f"http://{HOST}:{self.port}"
        self.health_url = self.url + health_path
        # A Python server's last words (a traceback, an out-of-memory) reach the log before it dies.
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.startup_s: float | None = None
        self._proc: subprocess.Popen | None = None
        self._stopped = False

    @property
    def pid(self) -> int | None:
        """The server's process id, which is also its process group's; None before start()."""
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float = 600.0) -> "ServerProcess":
        """Launch the server and return once its health URL answers 200; ServerFailed (the server ended) if it
        exits first or does not answer within timeout_s."""
        if self._proc is not None:
            raise RuntimeError("this server was started already; make a new ServerProcess")
        _check_free(self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        command = self.command
        try:
            if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
                if shutil.which(command[0]) is None:
                    raise FileNotFoundError(command[0])
                command = HUP_DEFAULT + command
            with open(self.log_path, "wb") as log:
                self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, env=self.env, process_group=0)
        except FileNotFoundError:
            raise ConfigError(f"the server program {self.command[0]!r} is not found",
                              "install it, or give its full path") from None
        atexit.register(self.stop)     # a last resort: an exception or a return ends it earlier
        _LIVE.add(self._proc.pid)
        try:
            self._wait_until_healthy(began, timeout_s)
        except BaseException:
            # Ctrl-C included: the terminal's SIGINT reaches our process group, not the server's.
            self.stop()
            raise
        self.startup_s = time.monotonic() - began
        return self

    def alive(self) -> bool:
        """Started and not exited (a paused server is alive)."""
        return self._proc is not None and self._exit_code() is None

    def died(self) -> Ended | None:
        """How the server ended, once it has (a crash during a measurement, or stop()); None while it runs."""
        code = self._exit_code()
        return None if code is None else Ended(code, _last_lines(self.log_path), self.log_path)

    def pids(self) -> list[int]:
        """The server's process and its descendants (engine workers), while it runs."""
        if not self.alive():
            return []
        try:
            root = psutil.Process(self._proc.pid)
            return [root.pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.Error:
            return []

    def pause(self) -> None:
        """SIGSTOP to the whole group; returns once its processes have stopped, so none of it runs meanwhile."""
        if self._signal(signal.SIGSTOP):
            self._wait_for_group((*EXITED, psutil.STATUS_STOPPED), SETTLE_S)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        """End the whole process group: SIGTERM, then SIGKILL to whatever is left after grace_s; return once every
        process of it has exited (its memory freed) and the server is reaped. Idempotent."""
        if self._proc is None or self._stopped:
            return
        self._signal(signal.SIGTERM)
        self._signal(signal.SIGCONT)   # a paused process acts on SIGTERM only once it runs again
        self._wait_for_group(EXITED, self.grace_s)
        self._signal(signal.SIGKILL)   # whatever outlived the grace period: a server deaf to SIGTERM, orphans
        self._wait_for_group(EXITED, SETTLE_S)
        # Reaped last, so every signal above went to our group. Orphans' zombies are init's to reap (this
        # machine's init took up to 2 s): they hold no memory, so they are not waited for.
        self._proc.wait()
        self._stopped = True
        _LIVE.discard(self._proc.pid)
        atexit.unregister(self.stop)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_until_healthy(self, began: float, timeout_s: float) -> None:
        while True:
            if ended := self.died():
                raise ServerFailed(ended.describe(f" during start-up, before {self.health_url} answered"))
            if _answers_200(self.health_url, min(PROBE_TIMEOUT_S, max(0.1, began + timeout_s - time.monotonic()))):
                return
            if time.monotonic() - began > timeout_s:
                raise ServerFailed(f"the server did not answer GET {self.health_url} with HTTP 200 within "
                                   f"{timeout_s:g} s, and was ended; "
                                   f"{_tail_text(_last_lines(self.log_path), self.log_path)}")
            time.sleep(POLL_S)

    def _exit_code(self) -> int | None:
        """The server's exit code once it has exited (negative: the signal that ended it). It is reaped only by
        stop(): until then its zombie keeps its id, and so its group's, from being given to another process,
        and the group's signals can reach only what the server started."""
        if self._proc is None:
            return None
        if self._proc.returncode is not None:
            return self._proc.returncode
        info = os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def _signal(self, sig: int) -> bool:
        """Whether the group was there to be sent `sig`: started, not yet stopped."""
        if self._proc is None or self._stopped:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)
        return True

    def _wait_for_group(self, statuses: tuple[str, ...], seconds: float) -> None:
        """Until every process of the group has one of these statuses, for at most `seconds`."""
        deadline = time.monotonic() + seconds
        while any(s not in statuses for s in _statuses(self._proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)


def kill_all() -> None:
    """SIGKILL every server group this process started and has not stopped: its last act before it dies."""
    for pgid in list(_LIVE):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def _statuses(pgid: int) -> list[str]:
    """The status of each process in the group, zombies included (they keep their group id until reaped)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                found.append(proc.status())
        except (OSError, psutil.Error):
            pass                       # ended meanwhile
    return found


def _free_port() -> int:
    # The port is free now; should another process take it before the server binds, the server exits saying so.
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _check_free(port: int) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as servers bind: TIME_WAIT is not "taken"
        try:
            sock.bind((HOST, port))
            return
        except OSError as exc:
            reason = exc.strerror or str(exc)
    raise ConfigError(f"port {port} on {HOST} is already in use ({reason}), so the server was not started",
                      "stop what holds it, or leave the port unset to get a free one")


def _answers_200(url: str, timeout_s: float) -> bool:
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (OSError, http.client.HTTPException):     # refused, reset, timed out, or an HTTP error status
        return False


def _last_lines(log_path: Path, n: int = LOG_TAIL_LINES) -> tuple[str, ...]:
    """The log's last n non-blank lines, read from its end only: an engine's log can be large."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return ()
    return tuple(line.rstrip()[:300] for line in text.splitlines() if line.strip())[-n:]


# an exception's own line: at the line's start, or after a logger's "[file:line] " prefix (not one quoted in a warning)
ERROR_LINE = re.compile(r"(?:^|\] )([A-Z]\w*(?:Error|Exception)): (\S.*)", re.MULTILINE)


def _first_error(log_path: Path) -> str | None:
    """The first `SomethingError: message` in the log: a server that dies at start-up raises its cause first and
    wraps it in less telling errors after (vLLM: 'ValueError: Available memory ...', then 'RuntimeError: Engine core
    initialization failed'), and the log's tail holds only the wrappers."""
    try:
        with open(log_path, "rb") as f:
            text = f.read(4 * 2**20).decode(errors="replace")
    except OSError:
        return None
    found = ERROR_LINE.search(text)
    return f"{found.group(1)}: {found.group(2)[:300].rstrip()}" if found else None


def _tail_text(lines: tuple[str, ...], log_path: Path) -> str:
    if not lines:
        return f"its log ({log_path}) is empty"
    return f"the last lines of its log ({log_path}):\n  " + "\n  ".join(lines)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
