"""What every rung of one sweep shares (the ladder makes it once; each rung reads it, and adds the scores it
measured for later rungs to reuse)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from experiments.core.recipe import Env, Target
from experiments.judge.gate import Gate
from experiments.record.console import SweepConsole
from experiments.targets.kinds.base import Scorer
from experiments.targets.workload import Workload


@dataclass
class Sweep:
    """What every rung of one sweep shares: config, machine, target, load, data, gate, where to record."""
    cfg: DictConfig
    env: Env
    target: Target
    workload: Workload
    scorer: Scorer                              # the target kind's: the workload, how answers are scored
    gate: Gate
    experiment_id: str
    ui: SweepConsole
    scores: dict = field(default_factory=dict)  # numerics key -> (accuracy, fidelity, rung that measured them)
    logs: Path | None = None                    # the rungs' child-process logs
