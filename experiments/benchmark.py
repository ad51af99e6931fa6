"""Closed-loop load over a concurrency ladder, with per-token timestamps.

Definitions (ARCHITECTURE.md, as vLLM / genai-perf use them): TTFT = first token - send; E2E = last token - send;
TPOT = (E2E - TTFT) / (output tokens - 1); ITL = the gaps between tokens; queue time = start of the first
engine step - arrival; model time = the engine's own compute. Errors and timeouts are counted as rates and
kept out of the latency percentiles.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import numpy as np

from experiments.kinds import DEFAULT_KIND, kind_of
from experiments.level import LevelReport
from experiments.load import run_level
from experiments.names import Metric
from experiments.serving.engine import Engine
from experiments.serving.servers import serve
from experiments.workload import Workload


@dataclass(frozen=True)
class BenchmarkReport:
    levels: tuple[LevelReport, ...]
    slos: tuple = ()
    capacity: object | None = None     # slo.CapacityResult when the SLA-capacity search ran
    kind: str = DEFAULT_KIND           # the workload's: its latencies and throughput

    def level(self, concurrency: int) -> LevelReport:
        for lv in self.levels:
            if lv.concurrency == concurrency:
                return lv
        raise KeyError(f"no level at concurrency {concurrency}; measured: {[lv.concurrency for lv in self.levels]}")

    def metric_series(self) -> dict[str, list[tuple[int, float]]]:
        """MLflow metrics: name -> [(step = concurrency, value)]."""
        out: dict[str, list[tuple[int, float]]] = {}

        def put(name, step, value):
            if value is not None and np.isfinite(value):
                out.setdefault(name, []).append((step, float(value)))

        for lv in self.levels:
            c = lv.concurrency
            for metric, st in lv.stats.items():
                if st is None:
                    continue
                for name in ("mean", "p50", "p95", "p99"):
                    put(f"{metric}_{name}", c, st.stat(name))
            put("qps", c, lv.qps)
            for name, value in kind_of(self.kind).level_metrics(lv).items():
                put(name, c, value)
            put("error_rate", c, lv.error_rate)
            put("timeout_rate", c, lv.timeout_rate)
            put("requests", c, len(lv.records))
            put("cpu_percent", c, lv.cpu_percent_mean)
            put("offered_qps", c, lv.offered_qps)
            if self.slos:
                goodput, attainment = lv.goodput(self.slos)
                put("goodput_rps", c, goodput)
                put("slo_attainment", c, attainment)
            put("rss_mb_max", c, lv.rss_mb_max)
            put("gpu_util_percent", c, lv.gpu_util_mean)
            put("gpu_mem_mb_max", c, lv.gpu_mem_mb_max)
            put("gpu_proc_mem_mb_max", c, lv.gpu_proc_mem_mb_max)
            put("kv_mb_in_use_max", c, lv.kv_mb_max)
        if self.capacity is not None and self.capacity.concurrency is not None:
            put("sla_capacity_concurrency", 0, self.capacity.concurrency)
        return out

    def samples_csv(self) -> str:
        buf = io.StringIO()
        cols = ["concurrency", "prompt_id", "input_tokens", "output_tokens", Metric.E2E_MS, Metric.TTFT_MS,
                Metric.TPOT_MS, Metric.QUEUE_MS, Metric.MODEL_MS, Metric.SEND_LAG_MS, "error", "timed_out"]
        applies = set(kind_of(self.kind).metrics) | {Metric.SEND_LAG_MS}
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        for lv in self.levels:
            for r in lv.records:
                row = {"concurrency": lv.concurrency, "prompt_id": r.prompt.id, "error": r.error or "",
                       "timed_out": r.timed_out, "input_tokens": len(r.prompt.token_ids),
                       "output_tokens": len(r.token_times)}
                if r.ok:
                    row.update({k: round(v, 4) for k, v in r.metrics().items() if k in cols and k in applies})
                w.writerow(row)
        return buf.getvalue()

    def validity(self) -> dict[str, bool]:
        return {f"c{lv.concurrency}_{flag}": value for lv in self.levels for flag, value in lv.validity().items()}


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
    from experiments.errors import ConfigError
    from experiments.slo import applicable, parse_all, sla_capacity

    slos, _ = applicable(parse_all(cfg.get("slos")), workload.metrics)
    if not workload.prompts:
        raise ConfigError("the workload has no prompts", "set target.workload.prompts to 1 or more")
    open_loop = cfg.get("mode", "closed") == "open"
    measured: dict[int, LevelReport] = {}

    def measure(load):
        on_level(load)
        level = run_level(server, workload, load, cfg, confidence)
        measured[level.concurrency] = level
        return level

    for load in (cfg.rates if open_loop else cfg.concurrency):
        measure(float(load) if open_loop else int(load))
    capacity = None
    if cfg.get("sla_search") and not open_loop:
        capacity = sla_capacity(lambda c: measured.get(c) or measure(c), list(cfg.concurrency), slos)
    return BenchmarkReport(tuple(measured[k] for k in sorted(measured)), tuple(slos), capacity, workload.kind)
