"""How busy the machine is with other work, read while the sweep itself is idle (before it starts and between
rungs): latencies measured beside other work read high and noisy, and the gate's consistency rule rejects a rung
whose rounds and recorded runs disagree. Said up front and on every rung, so that a reviewer who reads
"measurement inconsistent" can see why."""
from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

BUSY_SHARE = 0.25      # other work on more than a quarter of the cores: noticeably noisier latencies here
SAMPLE_S = 0.5


@dataclass(frozen=True)
class MachineLoad:
    busy_cores: float      # cores' worth of CPU in use over the sample, by anything (the sweep was idle)
    cores: int
    load1: float           # the kernel's 1-minute load average, for comparison with other tools

    @classmethod
    def sample(cls, seconds: float = SAMPLE_S) -> "MachineLoad":
        cores = psutil.cpu_count() or 1
        used = psutil.cpu_percent(interval=seconds) / 100.0 * cores
        return cls(round(used, 2), cores, round(os.getloadavg()[0], 2))

    @property
    def busy(self) -> bool:
        return self.busy_cores > BUSY_SHARE * self.cores

    def text(self) -> str:
        return (f"other work used {self.busy_cores:.1f} of {self.cores} cores (load average {self.load1:.1f}) "
                f"while the sweep was idle")

    def warning(self) -> str | None:
        if not self.busy:
            return None
        return (f"the machine is busy: {self.text()}. Latencies will read high and noisy, and the gate rejects a "
                f"rung whose rounds and recorded runs disagree (\"measurement inconsistent\"); for numbers to "
                f"compare, run the sweep on a quiet machine")

    def to_metrics(self) -> dict[str, float]:
        return {"machine/busy_cores": self.busy_cores, "machine/load1": self.load1}
