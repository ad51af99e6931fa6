"""Each challenger in a child process of its own, under a time and a memory limit.

A segfault, an out-of-memory or a hang in a rung's build or measurements becomes a reason, not the end of the
sweep. Children come from a fork server that imported the heavy libraries once and never ran a kernel: a fork of
it is quick and safe (no OpenMP or ONNX Runtime thread pools to inherit), unlike a fork of the sweep itself.
A child's own children (a rung's measuring processes) come from the same fork server, and the child tells the
sweep their ids: they count towards the rung's limits and are ended with it. Only processes this module started
are ever ended, each by its own id.
"""
from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import select
import signal
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path

import psutil

from experiments.core import progress
from experiments.core.errors import ConfigError, exception_line
from experiments.core.secrets import ScrubbedStream, guard_console
from experiments.core.settings import check_section
from experiments.measure.process_family import Watch, end as end_family
from experiments.serving import server_process

# Imported once by the fork server, so a child starts in a fraction of a second instead of ~8 s.
PRELOAD = ["experiments.measure.rung_process", "experiments.climb.ladder", "experiments.judge.accuracy",
           "experiments.record.plots", "experiments.serving.backends.pytorch.causal_lm",
           "experiments.serving.backends.pytorch.encoder", "experiments.serving.backends.onnxruntime.causal_lm",
           "experiments.serving.backends.onnxruntime.encoder", "lm_eval.evaluator", "matplotlib.pyplot"]
SIGNAL_MEANING = {signal.SIGSEGV: "segmentation fault", signal.SIGBUS: "bus error", signal.SIGABRT: "aborted",
                  signal.SIGKILL: "killed: by the kernel's out-of-memory killer or another process",
                  signal.SIGILL: "illegal instruction", signal.SIGFPE: "arithmetic fault"}
LOG_TAIL_LINES = 8


@dataclass(frozen=True)
class Limits:
    time_s: float
    memory_bytes: int
    poll_s: float

    @classmethod
    def for_rung(cls, cfg, name: str) -> "Limits":
        """conf/isolation: the defaults, overridden per rung under `rungs.<name>`."""
        own = (cfg.get("rungs") or {}).get(name) or {}
        gb = own.get("memory_limit_gb", cfg.memory_limit_gb)
        memory = float(gb) * 2**30 if gb is not None else float(cfg.memory_fraction) * psutil.virtual_memory().total
        return cls(float(own.get("time_limit_s", cfg.time_limit_s)), int(memory), float(cfg.poll_s))

    def describe(self) -> str:
        return f"{self.time_s:g} s, {self.memory_bytes / 2**30:.1f} GiB"


@dataclass(frozen=True)
class Outcome:
    value: object = None
    failure: str | None = None      # why the child gave no value: signal, limit hit, exit code, last log lines
    peak_rss_bytes: int = 0
    seconds: float = 0.0


def check_config(cfg) -> None:
    """Per-rung keys; the limits' types and ranges are in experiments/core/settings.py."""
    for name, own in (cfg.get("rungs") or {}).items():
        unknown = set(own) - {"time_limit_s", "memory_limit_gb"}
        if unknown:
            raise ConfigError(f"isolation.rungs.{name} has unknown keys {sorted(unknown)}",
                              "per-rung limits are time_limit_s and memory_limit_gb")
    check_section(cfg, "isolation")


_context = None


def _fork_server():
    global _context
    if _context is None:
        if multiprocessing.get_start_method(allow_none=True) not in multiprocessing.get_all_start_methods():
            # a worker of hydra/launcher=joblib defaults to loky's start method, which the fork server's children
            # would try (and fail) to set up: back to the platform's default, loky keeps its own context
            multiprocessing.set_start_method(None, force=True)
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def run(fn, args: tuple, limits: Limits, log_path: Path, on_start=None, on_progress=None) -> Outcome:
    """fn(*args) in a child; its value, or why there is none. A KeyboardInterrupt in the caller (a second
    Ctrl-C) ends the child at once and is raised again. What the child relays (experiments/core/progress.py) goes to
    on_progress as it comes."""
    ctx = _fork_server()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(sender, fn, args, str(log_path)), name=f"roi-ladder:{log_path.stem}")
    watch, failure = Watch(limits), None
    try:
        child.start()
        sender.close()
        progress.started_child(child.pid)
        if on_start:
            on_start(child.pid)
        while True:
            if receiver.poll(limits.poll_s):
                try:
                    status, value = receiver.recv()
                except (EOFError, OSError):
                    break                      # died without a word: the exit code says how
                if status == "child":
                    watch.adopt(value)
                elif status != "progress":
                    child.join(30)
                    if status == "raised":
                        raise value
                    if status == "failed":
                        end_family(child, watch.family)
                        return Outcome(None, f"{value} (traceback in {log_path})", watch.peak_rss_bytes,
                                       watch.seconds())
                    return Outcome(value, None, watch.peak_rss_bytes, watch.seconds())
                if on_progress:        # and on to the limits: a chatty child is watched as a quiet one
                    try:
                        on_progress(value)
                    except Exception:  # a display's fault must not cost the measurement
                        logging.getLogger(__name__).exception("progress display")
            elif not child.is_alive() and not receiver.poll(0):
                break
            if failure := watch.breach(child.pid):
                break
    except BaseException:
        end_family(child, watch.family)
        raise
    finally:
        receiver.close()
        sender.close()
    end_family(child, watch.family)
    if failure is None:
        failure = _exit_reason(child.exitcode)
    tail = _log_tail(log_path)
    return Outcome(None, f"{failure}{'; last log lines: ' + tail if tail else ''}", watch.peak_rss_bytes,
                   watch.seconds())


class ResidentFailed(RuntimeError):
    """A resident child gave no answer: the reason (signal, limit, exit code, its last log lines)."""


class Resident:
    """A child that builds something once (`setup()`), then runs calls on it one at a time, stopped in between.

    Stopped (SIGSTOP to its process group), nothing of it runs: no thread it left behind, no compiler worker, no
    allocator's background work can disturb what another process measures meanwhile. Should the sweep die while
    it is stopped, its group is orphaned and the kernel sends it SIGHUP and SIGCONT, which end it."""

    def __init__(self, setup, limits: Limits, log_path: Path):
        ctx = _fork_server()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path, self.watch = log_path, Watch(limits)
        self._conn, child_end = ctx.Pipe()
        self.child = ctx.Process(target=_resident_main, args=(child_end, setup, str(log_path)),
                                 name=f"roi-ladder:{log_path.stem}")
        try:
            self.child.start()
            child_end.close()
            progress.started_child(self.child.pid)
            self._answer()                 # built, or why not
            self._signal(signal.SIGSTOP)
        except BaseException:
            self.close()
            raise

    def call(self, fn, *args):
        """fn(what setup built, *args) in the child, which runs only for this call."""
        self._signal(signal.SIGCONT)
        self._conn.send((fn, args))
        value = self._answer()
        self._signal(signal.SIGSTOP)
        return value

    def close(self) -> None:
        self._signal(signal.SIGCONT)       # a stopped process dies of SIGKILL too; this lets its group go at once
        end_family(self.child, self.watch.family)
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _signal(self, sig) -> None:
        if self.child.pid is not None and self.child.exitcode is None:
            try:
                os.killpg(self.child.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    @property
    def peak_rss_bytes(self) -> int:
        return self.watch.peak_rss_bytes

    def _answer(self):
        self.watch.restart()               # each call has the whole time limit; the memory peak spans them all
        failure = None
        while failure is None:
            if self._conn.poll(self.watch.limits.poll_s):
                try:
                    status, value = self._conn.recv()
                except (EOFError, OSError):
                    break
                if status == "raised":
                    raise value
                if status == "failed":
                    end_family(self.child, self.watch.family)
                    raise ResidentFailed(f"{value} (traceback in {self.log_path})")
                return value
            if not self.child.is_alive():
                break
            failure = self.watch.breach(self.child.pid)
        end_family(self.child, self.watch.family)
        failure = failure or _exit_reason(self.child.exitcode)
        tail = _log_tail(self.log_path)
        raise ResidentFailed(f"{failure}{'; last log lines: ' + tail if tail else ''}")


def _resident_main(conn, setup, log_path: str) -> None:
    log_file = _settle_child(conn, log_path)
    try:
        built = setup()
        # A serving engine's server has a process group of its own, which this child's SIGSTOP does not reach.
        pause, resume = (getattr(built, name, lambda: None) for name in ("pause", "resume"))
        pause()
        conn.send(("ok", None))
        while (request := conn.recv()) is not None:
            fn, args = request
            resume()
            value = fn(built, *args)
            pause()
            conn.send(("ok", value))
    except ConfigError as exc:
        conn.send(("raised", exc))
    except Exception as exc:
        traceback.print_exc(file=log_file)
        conn.send(("failed", exception_line(exc)))
    except BaseException:
        traceback.print_exc(file=log_file)
        raise


def _child_main(sender, fn, args, log_path: str) -> None:
    log_file = _settle_child(sender, log_path)
    progress.connect(sender)
    try:
        progress.send_result(("ok", fn(*args)))
    except ConfigError as exc:    # bad input found by the rung: the sweep stops, as it would without a child
        progress.send_result(("raised", exc))
    except Exception as exc:      # the reason is the exception's own words; its traceback stays in the log
        traceback.print_exc(file=log_file)
        progress.send_result(("failed", exception_line(exc)))
    except BaseException:
        traceback.print_exc(file=log_file)
        raise

def _settle_child(sender, log_path: str):
    """A child's own process group, its death with the sweep, its log; returns the log file."""
    os.setpgrp()                      # a group of its own: what it starts is ended with it, by the group's id
    _die_with_sweep(sender)
    _ask_the_same_fork_server()
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")           # out of memory, the kernel ends the rung, not the sweep
    except OSError:
        pass
    guard_console()                   # the rung's prints and log records are scrubbed, as the sweep's are
    log_file = ScrubbedStream(open(log_path, "a", buffering=1))
    os.dup2(log_file.fileno(), 2)     # native libraries' messages (aborts, ORT, CUDA) land in the rung's log too
    faulthandler.enable(log_file, all_threads=False)  # a segfault's Python stack lands in the rung's log
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    return log_file


def _ask_the_same_fork_server() -> None:
    """This child's own children come from the fork server that forked it (its address and the sweep's liveness
    pipe came with the fork): one of its own would import torch, lm-eval and matplotlib once more, ~5 s of a core
    per rung here, and outlive it. Their ids go up to the sweep (progress.started_child)."""
    server = multiprocessing.forkserver._forkserver     # the stdlib's singleton: no public handle on it
    if server._forkserver_address is not None and server._forkserver_alive_fd is not None:
        server.ensure_running = multiprocessing.resource_tracker.ensure_running   # it runs: it forked this one


def _die_with_sweep(sender) -> None:
    """End this process, and what it started (servers' groups too), when the sweep's end of the result pipe
    closes: a SIGKILLed sweep leaves no rung running on. (The fork server outlives the sweep while a child runs,
    so the child watches the sweep itself; a pipe's write end reports POLLERR once its reader is gone.)"""
    def watch():
        poller = select.poll()
        poller.register(sender.fileno(), select.POLLERR | select.POLLHUP)
        while not poller.poll(1000):
            pass
        server_process.kill_all()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-sweep", daemon=True).start()


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"the rung's process died of {signal.Signals(-code).name} " \
               f"({SIGNAL_MEANING.get(signal.Signals(-code), 'a signal')})"
    return "the rung's process did not exit" if code is None else \
        f"the rung's process exited with code {code} before reporting a result"


def _log_tail(log_path: Path) -> str:
    """The last lines of the rung's log; after a fatal signal, faulthandler's report instead, whose first frames
    (most recent call first) say where it died."""
    try:
        lines = [line.rstrip()[:300] for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    picked = lines[fatal[-1]:fatal[-1] + LOG_TAIL_LINES] if fatal else lines[-LOG_TAIL_LINES:]
    return " | ".join(picked)[-1500:]
