"""Closed-loop load over a concurrency ladder, with per-token timestamps.

Definitions (ARCHITECTURE.md, as vLLM / genai-perf use them): TTFT = first token - send; E2E = last token - send;
TPOT = (E2E - TTFT) / (output tokens - 1); ITL = the gaps between tokens; queue time = start of the first
engine step - arrival; model time = the engine's own compute. Errors and timeouts are counted as rates and
kept out of the latency percentiles.
"""
from __future__ import annotations

from experiments.core.errors import ConfigError
from experiments.core.reports import BenchmarkReport, LevelReport
from experiments.core.slo import applicable, parse_all, sla_capacity
from experiments.measure.load import run_level
from experiments.serving.engine import Engine
from experiments.serving.servers import serve
from experiments.targets.kinds import kind_of
from experiments.targets.workload import LADDER, ROUNDS, Workload


def run_benchmark(engine: Engine, workload: Workload, cfg, confidence: float = 0.95,
                  on_level=lambda c: None) -> BenchmarkReport:
    """The load ladder (concurrency, or rates in open-loop mode), then the SLA-capacity search if asked."""
    server = serve(engine)
    try:
        return run_ladder(server, workload, cfg, confidence, on_level)
    finally:
        server.close()


def run_ladder(server, workload: Workload, cfg, confidence: float = 0.95,
               on_level=lambda c: None) -> BenchmarkReport:
    """run_benchmark over a server that is already up (in-process, or an HTTP endpoint); the caller closes it."""
    slos, _ = applicable(parse_all(cfg.get("slos")), kind_of(workload.kind).metrics)
    if not workload.prompts:
        raise ConfigError("the workload has no prompts", "set target.workload.prompts to 1 or more")
    open_loop = cfg.get("mode", "closed") == "open"
    measured: dict[int, LevelReport] = {}
    blocks = iter(range(LADDER, ROUNDS))

    def measure(load):
        on_level(load)
        # each level (and its warm-up) its own block of requests, in the order the levels run: the same for every
        # contender, and none sent to this server before
        level = run_level(server, workload, load, cfg, confidence, block=next(blocks))
        measured[level.concurrency] = level
        return level

    for load in (cfg.rates if open_loop else cfg.concurrency):
        measure(float(load) if open_loop else int(load))
    capacity = None
    if cfg.get("sla_search") and not open_loop:
        capacity = sla_capacity(lambda c: measured.get(c) or measure(c), list(cfg.concurrency), slos)
    return BenchmarkReport(tuple(measured[k] for k in sorted(measured)), tuple(slos), capacity, workload.kind)
