"""How busy the machine is with other work, read while the sweep itself is idle (before it starts and between
rungs): latencies measured beside other work read high and noisy, and the gate's consistency rule leaves a rung
undecided whose rounds and recorded runs disagree. Said up front and on every rung, so that a reviewer who reads
"measurement inconsistent" can see why. The sweep's own processes (a rung's child still exiting, its fork
server, its logging) are not other work: their CPU time is taken out of the machine's."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

BUSY_SHARE = 0.25      # other work on more than a quarter of the cores: noticeably noisier latencies here
SAMPLE_S = 0.5


@dataclass(frozen=True)
class MachineLoad:
    busy_cores: float      # cores' worth of CPU in use over the sample by processes outside the sweep's tree
    cores: int
    load1: float           # the kernel's 1-minute load average, for comparison with other tools

    @classmethod
    def sample(cls, seconds: float = SAMPLE_S, root: psutil.Process | None = None) -> "MachineLoad":
        """Other work: all but `root`'s tree (default: this process's)."""
        cores = psutil.cpu_count() or 1
        root = root or psutil.Process()
        machine, own, start = _busy_seconds(), _own_seconds(root), time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - start
        other = (_busy_seconds() - machine) - (_own_seconds(root) - own)
        return cls(round(max(0.0, other / elapsed), 2), cores, round(os.getloadavg()[0], 2))

    @property
    def busy(self) -> bool:
        return self.busy_cores > BUSY_SHARE * self.cores

    def text(self) -> str:
        return (f"other work used {self.busy_cores:.1f} of {self.cores} cores (load average {self.load1:.1f}) "
                f"while the sweep was idle")

    def warning(self) -> str | None:
        if not self.busy:
            return None
        return (f"the machine is busy: {self.text()}. Latencies will read high and noisy, and a rung whose rounds "
                f"and recorded runs still disagree after both were measured again is undecided; for numbers to "
                f"compare, run the sweep on a quiet machine")

    def to_metrics(self) -> dict[str, float]:
        return {"machine/busy_cores": self.busy_cores, "machine/load1": self.load1}


def _busy_seconds() -> float:
    """CPU seconds every core has spent on anything but idling, since boot."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own_seconds(root: psutil.Process) -> float:
    """CPU seconds of `root` and every living descendant (one that exits mid-sample counts as other)."""
    total = 0.0
    for p in (root, *root.children(recursive=True)):
        try:
            t = p.cpu_times()
        except psutil.Error:          # gone between listing and reading
            continue
        total += t.user + t.system
    return total
