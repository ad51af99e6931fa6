"""The processes a measuring child is made of, watched and ended together: its tree's resident memory and
time against its limits (`Watch`), and `end`, which ends the child's group and every process seen in it."""
from __future__ import annotations

import os
import signal
import time

import psutil


class Watch:
    """The limits of one child, checked between its messages: its process tree's resident memory (peak kept)
    and the time since the watch began. Every process seen is kept in `family`, to be ended with it."""

    def __init__(self, limits):          # isolation.Limits
        self.limits, self.family, self.peak_rss_bytes = limits, {}, 0
        self.adopted: list[psutil.Process] = []   # the child's own children: its siblings under the fork server
        self.restart()

    def adopt(self, pid: int) -> None:
        try:
            self.adopted.append(psutil.Process(pid))   # kept by object: a reused id is never taken for it
        except psutil.Error:
            pass                                         # gone already

    def restart(self) -> None:
        self.started = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def breach(self, pid: int) -> str | None:
        self.adopted = [p for p in self.adopted if p.is_running()]     # those that ended are done with
        rss = sum(tree_rss(p, self.family) for p in (pid, *self.adopted))
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        if rss > self.limits.memory_bytes:
            return (f"memory limit hit: the rung's processes held {rss / 2**30:.2f} GiB resident, over the "
                    f"limit of {self.limits.memory_bytes / 2**30:.2f} GiB (isolation.memory_limit_gb)")
        if self.seconds() > self.limits.time_s:
            return (f"time limit hit: still running after {self.limits.time_s:g} s (isolation.time_limit_s); "
                    f"it may hang")
        return None


def tree_rss(root: int | psutil.Process, family: dict) -> int:
    """Resident memory of a process and its descendants; each process seen is kept in `family`, so it can be
    ended later even once it has been handed to init."""
    try:
        procs = [root if isinstance(root, psutil.Process) else psutil.Process(root)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        family.setdefault(proc.pid, proc)
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def end(child, family: dict) -> None:
    """SIGKILL the child's process group and each process seen in it: only what the rung started. psutil checks
    a process is still the one seen (its start time), so a reused pid is never hit."""
    if child.pid is None:
        return
    if child.exitcode is None:       # not reaped yet: its pid, and its group's id, are still its own
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            child.kill()              # it had not made its group yet
    for proc in family.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    child.join(30)
    psutil.wait_procs([p for p in family.values() if p.pid != child.pid], timeout=10)
