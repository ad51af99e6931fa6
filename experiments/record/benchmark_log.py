"""A benchmark report as MLflow records it: metrics by concurrency step, and every request as CSV rows; the
target kind says which throughput and latency columns apply; and a soak's windows."""
from __future__ import annotations

import csv
import io

import mlflow
import numpy as np

from experiments.core.names import Metric, Tag
from experiments.core.reports import BenchmarkReport
from experiments.measure.soak import SoakReport
from experiments.record import tracking
from experiments.targets.kinds import kind_of


def metric_series(bench: BenchmarkReport) -> dict[str, list[tuple[int, float]]]:
    """MLflow metrics: name -> [(step = concurrency, value)]."""
    out: dict[str, list[tuple[int, float]]] = {}

    def put(name, step, value):
        if value is not None and np.isfinite(value):
            out.setdefault(name, []).append((step, float(value)))

    for lv in bench.levels:
        c = lv.concurrency
        for metric, st in lv.stats.items():
            if st is None:
                continue
            for name in ("mean", "p50", "p95", "p99"):
                put(f"{metric}_{name}", c, st.stat(name))
        put("qps", c, lv.qps)
        for name, value in kind_of(bench.kind).level_metrics(lv).items():
            put(name, c, value)
        put("error_rate", c, lv.error_rate)
        put("timeout_rate", c, lv.timeout_rate)
        put("requests", c, len(lv.records))
        put("cpu_percent", c, lv.cpu_percent_mean)
        put("offered_qps", c, lv.offered_qps)
        if bench.slos:
            goodput, attainment = lv.goodput(bench.slos)
            put("goodput_rps", c, goodput)
            put("slo_attainment", c, attainment)
        put("rss_mb_max", c, lv.rss_mb_max)
        put("gpu_util_percent", c, lv.gpu_util_mean)
        put("gpu_mem_mb_max", c, lv.gpu_mem_mb_max)
        put("gpu_proc_mem_mb_max", c, lv.gpu_proc_mem_mb_max)
        put("kv_mb_in_use_max", c, lv.kv_mb_max)
        for name, value in (lv.server_metrics or {}).items():
            put(f"server_{name}", c, value)
    if bench.capacity is not None and bench.capacity.concurrency is not None:
        put("sla_capacity_concurrency", 0, bench.capacity.concurrency)
    return out


def samples_csv(bench: BenchmarkReport) -> str:
    buf = io.StringIO()
    cols = ["concurrency", "prompt_id", "input_tokens", "output_tokens", Metric.E2E_MS, Metric.TTFT_MS,
            Metric.TPOT_MS, Metric.QUEUE_MS, Metric.MODEL_MS, Metric.SEND_LAG_MS, "error", "timed_out"]
    applies = set(kind_of(bench.kind).metrics) | {Metric.SEND_LAG_MS}
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for lv in bench.levels:
        for r in lv.records:
            row = {"concurrency": lv.concurrency, "prompt_id": r.prompt.id, "error": r.error or "",
                   "timed_out": r.timed_out, "input_tokens": len(r.prompt.token_ids),
                   "output_tokens": len(r.token_times)}
            if r.ok:
                row.update({k: round(v, 4) for k, v in r.metrics().items() if k in cols and k in applies})
            w.writerow(row)
    return buf.getvalue()


def log_soak(soak: SoakReport, prefix: str = "soak") -> None:
    """The soak's windows as MLflow series, its metrics, CSV, report and plot, under `prefix` (a longer soak
    of a rung afterwards: soak_followup, beside the sweep's own)."""
    columns = ("p95_e2e_ms", "qps", "errors", "rss_mb", "gpu_mem_mb")
    tracking.log_series({f"{prefix}/window/{c}": [(i, float(getattr(w, c))) for i, w in enumerate(soak.windows)
                                                  if getattr(w, c) is not None] for c in columns})
    mlflow.log_metrics({prefix + k.removeprefix("soak"): v for k, v in soak.to_metrics().items()})
    mlflow.log_text(soak.to_csv(), f"{prefix}/timeseries.csv")
    mlflow.log_text(soak.to_markdown(), f"{prefix}/report.md")
    mlflow.log_figure(soak.figure(), f"{prefix}/timeseries.png")
    if soak.gpu_note:
        mlflow.set_tag(Tag.SOAK_GPU, soak.gpu_note)
