"""The soak criterion: a challenger that passed every other criterion held under load on a fresh build, its
latency drift and memory growth judged (measure/soak.py); skipped, with the reason, otherwise."""
from __future__ import annotations

from experiments.climb import contender
from experiments.climb.sweep import Sweep
from experiments.core.names import Tag
from experiments.core.reports import BenchmarkReport
from experiments.judge.gate import Criterion
from experiments.measure import soak
from experiments.record import benchmark_log, rung_log
from experiments.serving.servers import serve


def soaked(cand, bench, criteria, sweep: Sweep, name: str, run_id: str, apart: contender.Apart) -> list[Criterion]:
    if _skipped(criteria, sweep.cfg):
        return soak_criterion(None, bench, criteria, sweep, name)      # tags why; builds nothing
    with sweep.ui.stage(f"{name}: soak, on a fresh build in a process of its own") as st:
        return contender.soaked(soak_criterion, cand, bench, criteria, sweep, name, run_id, apart,
                                on_progress=st.relayed)


def soak_criterion(engine, bench: BenchmarkReport, criteria: list[Criterion], sweep: Sweep,
                   name: str) -> list[Criterion]:
    """Cheapest first: only a challenger that passed every other criterion is held under load this long."""
    cfg = sweep.cfg
    why = _skipped(criteria, cfg)
    if why:
        rung_log.note(Tag.SOAK, f"skipped: {why}")
        return []
    clients, why = soak.concurrency_for(cfg.soak.concurrency, bench.capacity, objective_level(cfg))
    total = cfg.soak.warmup_s + cfg.soak.duration_s
    with sweep.ui.stage(f"{name}: soak at c={clients} ({why}) for {total:g} s") as st:
        report = soak_engine(engine, sweep.workload, cfg.soak, clients, st)
    benchmark_log.log_soak(report)
    crit = report.criterion()
    rung_log.note(Tag.SOAK, f"ran at c={clients} ({why}): {report.outcome}"
                            + (f" by a {report.measured_s:.0f}-second soak" if report.outcome == "not decided" else ""))
    return [crit]


def soak_engine(engine, workload, cfg_soak, clients: int, st) -> soak.SoakReport:
    """The engine served and soaked at `clients`, its windows counted on the stage `st`."""
    server = serve(engine)
    try:
        windows, seen = sum(soak.window_counts(cfg_soak)), []
        st.progress(0, windows, "soak", f"windows of {cfg_soak.window_s:g} s",
                    planned_s=cfg_soak.warmup_s + cfg_soak.duration_s)
        return soak.run_soak(server, workload, cfg_soak, clients,
                             on_window=lambda w: (seen.append(w), st.progress(len(seen), windows)),
                             bound_mb=getattr(engine, "bounded_cache_mb", lambda: None)())
    finally:
        server.close()


def objective_level(cfg) -> int:
    """The gate's objective concurrency: the soak's level where no SLA capacity was measured."""
    obj = cfg.gate.objective
    return int(max(cfg.benchmark.concurrency)) if obj.concurrency == "max" else int(obj.concurrency)


def _skipped(criteria: list[Criterion], cfg) -> str | None:
    failed = [c.name for c in criteria if not c.passed and not c.undecided]
    if failed:
        return f"{', '.join(failed)} failed first"
    if open_ := [c.name for c in criteria if c.undecided]:
        return f"{', '.join(open_)} undecided first"
    return None if cfg.soak.enabled else "soak.enabled=false"
