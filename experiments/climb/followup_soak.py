"""`roi-ladder soak`: a rung soaked again, for as long as conf/soak says (the production profile's 4 min warm-up
and 30 min by default), where its sweep's soak was too short to tell a leak. The rung's recipe is built as its
sweep built it, on its sweep's workload, alone in this process; the outcome goes on the rung's run
(roi.soak.followup, metrics and files under soak_followup/), where `roi-ladder promote` reads it."""
from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig

from experiments.climb.soaking import objective_level, soak_engine
from experiments.core.names import Tag
from experiments.measure import soak
from experiments.record import benchmark_log, packaged, registry, tracking
from experiments.serving import build_engine
from experiments.targets import kinds
from experiments.targets.resolve import resolve


def soak_rung(cfg: DictConfig, run_id: str | None, console) -> soak.SoakReport:
    soak.check_config(cfg.soak)
    run = registry.rung_run(cfg.tracking, run_id)
    swept = registry.sweep_config(run)
    cand = packaged.candidate_of(registry.package_recipe(run, swept), Path(cfg.cache_dir))
    clients = _clients(cfg.soak.concurrency, run.data.tags.get(Tag.SOAK, ""), swept)
    with console.stage("target: loading the sweep's workload"):
        target, texts, tasks = resolve(swept.target, Path(cfg.cache_dir), Path(swept.data_dir), console.note)
        include = Path(swept.accuracy.include_path) if swept.accuracy.get("include_path") else tasks
        workload = kinds.for_target(swept, target, texts, include).workload()
    with console.stage(f"{run.data.tags.get(Tag.RUNG)}: building {' + '.join(cand.rungs)}"):
        engine = build_engine(cand, int(cfg.threads), Path(cfg.cache_dir) / "artefacts")
    try:
        with console.stage(f"soak at c={clients} for {cfg.soak.warmup_s + cfg.soak.duration_s:g} s") as st:
            report = soak_engine(engine, workload, cfg.soak, clients, st)
    finally:
        engine.close()
    with tracking.attach(str(cfg.tracking.uri), run.info.run_id):
        benchmark_log.log_soak(report, "soak_followup")
        tracking.set_tag(Tag.SOAK_FOLLOWUP, f"{report.outcome} after a {report.measured_s:.0f}-second soak at "
                                            f"c={clients}: {report.criterion().detail}"[:5000])
    return report


def _clients(setting, sweep_soak: str, swept) -> int:
    """The configured concurrency; `sla`: the level the sweep's own soak ran at, else the gate's objective."""
    if setting != "sla":
        return int(setting)
    if found := re.match(r"ran at c=(\d+)", sweep_soak):
        return int(found.group(1))
    return objective_level(swept)
