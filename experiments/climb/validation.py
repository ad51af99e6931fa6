"""Everything checked before any long work: the config's values, the data directory, the rungs themselves."""
from __future__ import annotations

import json
from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from experiments.analyse.capacity import check_config as check_capacity_config
from experiments.climb.overrides import check_writable
from experiments.core.errors import ConfigError
from experiments.core.recipe import Env
from experiments.core.settings import check_settings
from experiments.judge.gate import AIMS
from experiments.judge.gate import check_config as check_gate_config
from experiments.measure import isolation, soak
from experiments.measure.load import check_load
from experiments.targets import kinds
from experiments.targets.prompts_file import check_file
from experiments.targets.resolve import check_source
from optimizers.base import Optimizer
from optimizers.baseline import EagerBaseline


def load_rungs(cfg: DictConfig) -> list[tuple[str, Optimizer]]:
    rungs, seen = [], {}
    for name, rung_cfg in (cfg.ladder.get("rungs") or {}).items():
        if not isinstance(rung_cfg, DictConfig) or "_target_" not in rung_cfg:
            raise ConfigError(f"rung {name!r} has no _target_",
                              "point _target_ at an Optimizer class in optimizers/, as conf/rung/*.yaml do")
        settings = json.dumps(OmegaConf.to_container(rung_cfg, resolve=True), sort_keys=True)
        if settings in seen:   # the same recipe climbed twice: a second verdict on one change, twice the time
            raise ConfigError(f"the ladder lists one rung twice: {name!r} has the same config as {seen[settings]!r}",
                              f"drop {name!r} from the ladder (or give it different settings)")
        seen[settings] = name
        rungs.append((name, rung_from(name, rung_cfg)))
    if not rungs or not isinstance(rungs[0][1], EagerBaseline):
        raise ConfigError("the ladder must start with the baseline rung (the first champion)",
                          "put `/rung@rungs.baseline: baseline` first in the ladder's defaults")
    return rungs


def rung_from(name: str, rung_cfg) -> Optimizer:
    """The Optimizer a rung's config makes (its `_target_` and arguments), with its name and `aim`."""
    aim = rung_cfg.get("aim", "speed")
    if aim not in AIMS:
        raise ConfigError(f"rung {name!r} has aim {aim!r}, which is not one of {AIMS}",
                          f"set ladder.rungs.{name}.aim to speed (a gain) or memory (a saving at no slowdown)")
    try:
        opt = instantiate({key: value for key, value in rung_cfg.items() if key != "aim"})
    except InstantiationException as exc:
        cause = exc.__cause__ or exc
        fix = (f"change the value the message names (conf/rung/{name}.yaml, or on the command line)"
               if isinstance(cause, ValueError) else "keys must match the optimizer's arguments")
        raise ConfigError(f"rung {name!r} could not be built from its config: {cause}",
                          f"check conf/rung/{name}.yaml: {fix}") from None
    if not isinstance(opt, Optimizer):
        raise ConfigError(f"rung {name!r} has _target_ {rung_cfg.get('_target_')}, which is not an Optimizer",
                          "point _target_ at a class in optimizers/")
    opt.name, opt.aim = name, aim
    return opt


def check_required(cfg: DictConfig, rungs: list[tuple[str, Optimizer]], env: Env) -> None:
    """`ladder.required`: rungs this sweep is for. One this machine cannot run (no CUDA device, a missing
    package), or one that the config leaves nothing to be judged on (as a forced one), is refused now rather
    than recorded as skipped after the baseline has been measured."""
    by_name = dict(rungs)
    required = list(cfg.ladder.get("required") or [])
    for name, opt in rungs:
        must = "is required (ladder.required)" if name in required else "is forced (force: true)" if opt.force else ""
        if must and (refusal := opt.config_check()):
            problem, fix = refusal
            release = (f"drop {name!r} from ladder.required" if name in required
                       else f"set ladder.rungs.{name}.force=false")
            raise ConfigError(f"rung {name!r} {must}, but {problem}", f"{fix}; or {release} to let the sweep skip it")
    for name in required:
        if name not in by_name:
            raise ConfigError(f"ladder.required names {name!r}, which is not in the ladder ({', '.join(by_name)})",
                              f"add conf/rung/{name}.yaml to the ladder or drop {name!r} from ladder.required")
        if reason := by_name[name].machine_check(env):
            raise ConfigError(f"rung {name!r} is required (ladder.required) but cannot run on this machine: "
                              f"{reason}", f"run the sweep where it can, or drop {name!r} from ladder.required "
                                       "to let the sweep skip it")


def validate(cfg: DictConfig, env: Env | None = None) -> list[tuple[str, Optimizer]]:
    check_settings(cfg)
    folder = check_source(cfg.target)
    if isinstance(cfg.target.get("workload", {}).get("prompts"), str):   # the user's own traffic
        check_file(Path(cfg.target.workload.prompts))
    bench = cfg.benchmark
    check_load(bench)
    levels = [int(round(float(r))) for r in bench.rates] if bench.mode == "open" else list(bench.concurrency)
    check_capacity_config(cfg.capacity)
    soak.check_config(cfg.soak)
    isolation.check_config(cfg.isolation)
    check_gate_config(cfg.gate)
    obj = cfg.gate.objective
    if obj.concurrency != "max" and (not str(obj.concurrency).isdigit() or int(obj.concurrency) not in levels):
        raise ConfigError(f"gate.objective.concurrency={obj.concurrency} is not a measured level {levels}",
                          "add it to benchmark.concurrency or pick one of the levels")
    check_writable(Path(cfg.data_dir))
    kind = folder.kind if folder else cfg.target.kind   # a user's folder: its kind is known once inspected
    if kind in kinds.names():
        kinds.kind_of(kind).check(cfg, folder.path if folder else None)
    rungs = load_rungs(cfg)
    check_required(cfg, rungs, env or Env.detect())
    return rungs
