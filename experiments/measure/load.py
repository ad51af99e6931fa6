"""Load generation: one level of a load ladder, closed loop (N clients) or open loop (seeded arrivals)."""
from __future__ import annotations

import threading
import time

import numpy as np

from experiments.core.errors import ConfigError
from experiments.core.reports import LevelReport
from experiments.core.request import RequestRecord
from experiments.core.slo import parse_all
from experiments.core.stats import LatencyStats
from experiments.measure.resources import ResourceSampler
from experiments.serving.server_process import ServerFailed
from experiments.targets.kinds import kind_of
from experiments.targets.workload import LADDER, Requests, Workload


def run_level(server, workload: Workload, load: float, cfg, confidence: float, block: int = LADDER) -> LevelReport:
    """One level: warm-up (discarded), then the measured window. `load` is clients (closed) or requests/s (open).
    `block` says which of the workload's requests it sends (Workload.requests): each run of requests to one server
    its own, so that no prompt is sent to it twice unless the workload repeats."""
    is_open = cfg.get("mode", "closed") == "open"
    if load <= 0 or (not is_open and int(load) != load):
        raise ValueError(f"{'rate' if is_open else 'concurrency'} must be {'> 0' if is_open else 'an integer >= 1'}"
                         f", got {load}")

    def drive(prompts, min_requests, min_s):
        if is_open:
            return open_loop(server, prompts, float(load), cfg.get("arrival", "poisson"), cfg.get("gamma_shape", 1.0),
                             int(cfg.get("seed", 0)), min_requests, min_s, cfg.max_duration_s, cfg.request_timeout_s)
        return closed_loop(server, prompts, int(load), min_requests, min_s, cfg.max_duration_s,
                           cfg.request_timeout_s)

    drive(workload.requests(block, warmup=True), cfg.warmup_requests, cfg.get("warmup_s", 0.0))
    still_serving(server, "during the warm-up")
    with ResourceSampler(kv_probe=getattr(server, "kv_usage", None), processes=getattr(server, "processes", None),
                         server_probe=getattr(server, "server_probe", None)) as sampler:
        started = time.perf_counter()
        records = drive(workload.requests(block), cfg.min_requests, cfg.min_duration_s)
        duration = time.perf_counter() - started
    still_serving(server, f"during the level at {'rate' if is_open else 'concurrency'} {load:g}")
    level = LevelReport(concurrency=int(round(load)), duration_s=duration, records=tuple(records), stats={},
                        min_requests_met=len(records) >= cfg.min_requests,
                        offered_qps=float(load) if is_open else None, started=started,
                        resources=sampler.series(), **sampler.summary())
    level.stats.update({m: LatencyStats.from_samples(level.values(m), confidence) for m in kind_of(workload.kind).metrics})
    return level


def still_serving(server, when: str) -> None:
    """A serving engine whose server died is the level's failure, named with its exit and last log lines."""
    if (gone := getattr(server, "gone", None)) and (reason := gone(when)):
        raise ServerFailed(reason)


def open_loop(server, prompts, rate, process, gamma_shape, seed, min_requests, min_s, max_s, timeout_s):
    """Arrivals on a seeded Poisson (or gamma) schedule, whatever the server does; latency counts from the
    intended send time, and the lag of the actual send is recorded, so coordinated omission shows."""
    rng = np.random.default_rng(seed)
    records: list[RequestRecord] = []
    started = intended = time.perf_counter()
    while True:
        elapsed = intended - started
        if elapsed >= max_s or (elapsed >= min_s and len(records) >= min_requests):
            break
        intended += rng.exponential(1 / rate) if process == "poisson" else rng.gamma(gamma_shape, 1 / (rate * gamma_shape))
        time.sleep(max(0.0, intended - time.perf_counter()))
        records.append(server.submit(nth(prompts, len(records)), intended=intended))
    for rec in records:
        left = rec.arrival + timeout_s - time.perf_counter()
        if not rec.done.wait(max(0.0, left)) or (rec.token_times and rec.token_times[-1] - rec.arrival > timeout_s):
            rec.timed_out = rec.cancelled = True
    return records


def closed_loop(server, prompts, concurrency, min_requests, min_s, max_s, timeout_s) -> list[RequestRecord]:
    """`concurrency` clients, each sending its next request as soon as the last one finished."""
    records: list[RequestRecord] = []
    lock = threading.Lock()
    started = time.perf_counter()
    counter = iter(range(10**9))

    def enough() -> bool:
        elapsed = time.perf_counter() - started
        return elapsed >= max_s or (elapsed >= min_s and len(records) >= min_requests)

    def client():
        while True:
            with lock:
                if enough():
                    return
                i = next(counter)
            rec = server.submit(nth(prompts, i))
            if not rec.done.wait(timeout_s):
                rec.timed_out = rec.cancelled = True
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def nth(prompts, i: int):
    """The i-th request of a run: Workload.requests' own, or a list of prompts cycled."""
    return prompts[i] if isinstance(prompts, Requests) else prompts[i % len(prompts)]


def check_load(bench) -> None:
    """The load settings that are not numbers (those are in experiments/core/settings.py), checked before anything
    is built or sent."""
    slos = parse_all(bench.slos)
    if bench.sla_search and not slos:
        raise ConfigError("benchmark.sla_search=true needs SLOs", "set benchmark.slos=[p99_e2e_ms<=500]")
