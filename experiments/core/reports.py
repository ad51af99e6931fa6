"""What a load ladder measured, as values: one concurrency level's requests, their latency statistics, the
resources sampled meanwhile and its validity (LevelReport), and the ladder's levels (BenchmarkReport). The gate
judges these; experiments/measure produces them; experiments/record/benchmark_log renders them for MLflow."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from experiments.core.names import DEFAULT_KIND, Metric
from experiments.core.request import RequestRecord
from experiments.core.slo import request_meets
from experiments.core.stats import MIN_SAMPLES_FOR_P99, LatencyStats


SATURATED = 0.98   # an open-loop level served below this share of its offered rate: its queue grew without bound


@dataclass(frozen=True)
class ResourceSeries:
    """The samples of one level, in time order, every `interval_s`: what the diagnosis reads curve shapes from.
    CPU percent is of one core (psutil: 200 = two cores busy); GPU lists are empty without NVML."""
    interval_s: float
    cpu_percent: tuple[float, ...] = ()
    rss_mb: tuple[float, ...] = ()
    host_mem_percent: tuple[float, ...] = ()
    gpu_util: tuple[float, ...] = ()
    gpu_mem_mb: tuple[float, ...] = ()
    gpu_mem_total_mb: float | None = None
    cpu_count: int = 1
    gpu_skipped: str = ""
    gpu_proc_mem_mb: tuple[float, ...] = ()   # the engine's processes' GPU memory, where the driver reports it
    gpu_proc_skipped: str = ""


@dataclass(frozen=True)
class LevelReport:
    concurrency: int                   # closed loop: clients; open loop: the rate in requests/s, rounded
    duration_s: float
    records: tuple[RequestRecord, ...] = field(repr=False)
    stats: dict[str, LatencyStats | None] = field(repr=False)
    cpu_percent_mean: float
    rss_mb_max: float
    min_requests_met: bool
    offered_qps: float | None = None   # open loop only: the arrival rate asked for
    started: float = 0.0
    gpu_util_mean: float | None = None  # NVML, when a CUDA device is present
    gpu_mem_mb_max: float | None = None
    gpu_proc_mem_mb_max: float | None = None   # the engine's processes' own, where the driver reports it
    kv_mb_max: float | None = None     # paged KV cache: the most KV memory the sequences held at once
    server_metrics: dict[str, float] | None = None   # a serving engine's own /metrics over the level
    resources: ResourceSeries | None = field(default=None, repr=False)   # the samples, for the diagnosis

    def validity(self, windows: int = 5, tolerance: float = 0.10) -> dict[str, bool]:
        """ARCHITECTURE.md's rules: stable = last 3 windows within +-10 % (throughput and P50 E2E);
        saturated = achieved/offered < 0.98; no P99 claim under 100 samples; invalid above 1 % errors."""
        flags = {"stable": self._stable(windows, tolerance), "p99_claimable": self.n_ok >= MIN_SAMPLES_FOR_P99,
                 "error_rate_ok": self.error_rate <= 0.01, "min_requests_met": self.min_requests_met}
        if self.offered_qps:
            flags["saturated"] = self.qps / self.offered_qps < 0.98
        return flags

    def _stable(self, windows: int, tolerance: float) -> bool:
        ok = [r for r in self.records if r.ok]
        if len(ok) < 3 * windows:
            return False
        edges = np.linspace(self.started, self.started + self.duration_s, windows + 1)
        done = np.array([r.token_times[-1] for r in ok])
        e2e = np.array([r.metrics()[Metric.E2E_MS] for r in ok])
        per_window = [(int(((done >= a) & (done < b)).sum()), e2e[(done >= a) & (done < b)])
                      for a, b in zip(edges[:-1], edges[1:])][-3:]
        counts = np.array([c for c, _ in per_window], float)
        if (counts == 0).any():
            return False
        p50s = np.array([np.median(v) for _, v in per_window])
        return all(np.abs(x / x.mean() - 1).max() <= tolerance for x in (counts, p50s))

    def goodput(self, slos) -> tuple[float, float]:
        """(requests/s meeting every SLO, share of all requests that did); errors and timeouts are misses."""
        good = sum(request_meets(r, slos) for r in self.records)
        return good / self.duration_s, good / max(1, len(self.records))

    @property
    def n_ok(self) -> int:
        return sum(r.ok for r in self.records)

    @property
    def error_rate(self) -> float:
        return sum(r.error is not None for r in self.records) / max(1, len(self.records))

    @property
    def timeout_rate(self) -> float:
        return sum(r.timed_out for r in self.records) / max(1, len(self.records))

    @property
    def qps(self) -> float:
        return self.n_ok / self.duration_s

    @property
    def output_tokens_per_s(self) -> float:
        return sum(len(r.token_times) for r in self.records if r.ok) / self.duration_s

    @property
    def input_tokens_per_s(self) -> float:
        return sum(len(r.prompt.token_ids) for r in self.records if r.ok) / self.duration_s

    @property
    def batch_size_mean(self) -> float:
        """Requests per engine batch (those that share an engine start)."""
        starts = [r.engine_start for r in self.records if r.ok and r.engine_start is not None]
        return len(starts) / max(1, len(set(starts)))

    def values(self, metric: str) -> np.ndarray:
        ok = [r for r in self.records if r.ok]
        if metric == Metric.BATCH_MS:
            batches: dict[float, float] = {}
            for r in ok:
                if r.engine_start is not None:
                    batches[r.engine_start] = max(batches.get(r.engine_start, 0.0), r.token_times[-1] - r.engine_start)
            return np.array(list(batches.values())) * 1e3
        if metric == Metric.ITL_MS:
            return np.array([gap for r in ok for gap in r.itl_ms()])
        return np.array([m[metric] for m in (r.metrics() for r in ok) if metric in m])


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

    def with_level(self, level: LevelReport) -> "BenchmarkReport":
        """This report with `level` in place of the one measured at its concurrency (a run measured again)."""
        return replace(self, levels=tuple(level if lv.concurrency == level.concurrency else lv for lv in self.levels))

    def validity(self) -> dict[str, bool]:
        return {f"c{lv.concurrency}_{flag}": value for lv in self.levels for flag, value in lv.validity().items()}


def peak_in_flight(bench) -> tuple[int | None, str]:
    """(the most requests `bench`'s load had in flight at once, how it is known; None where it is not): a closed
    loop's top concurrency; an open loop's largest count of requests in the server (running + waiting in one
    /metrics scrape) at the levels it kept up with (a saturated level's queue grows with the level's length,
    not the load)."""
    if not bench.levels:
        return None, "no load ladder was measured"
    if not any(lv.offered_qps for lv in bench.levels):
        return max(lv.concurrency for lv in bench.levels), "the load ladder's top concurrency"
    seen = [lv.server_metrics["in_flight_max"] for lv in bench.levels
            if lv.server_metrics and "in_flight_max" in lv.server_metrics and lv.qps >= SATURATED * lv.offered_qps]
    if seen and max(seen) >= 1:
        return round(max(seen)), "the most requests the server held at once (/metrics) at a rate it kept up with"
    return None, ("an open-loop load whose server reported no requests in flight (/metrics) at a level it kept "
                  "up with")
