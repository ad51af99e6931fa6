"""Service-level objectives (`p99_e2e_ms<=500`), goodput, and the SLA-capacity search."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from experiments.core.errors import ConfigError
from experiments.core.names import LATENCY_METRICS as METRICS, Metric

_SLO = re.compile(r"^\s*(p\d{1,2}(?:\.\d+)?|mean)_([a-z0-9]+_ms)\s*(<=|<)\s*(\d+(?:\.\d+)?)\s*$")


@dataclass(frozen=True)
class SLO:
    stat: str          # p50 | p95 | p99 | mean
    metric: str        # e2e_ms | ttft_ms | ...
    threshold: float
    text: str

    @classmethod
    def parse(cls, text: str) -> "SLO":
        m = _SLO.match(str(text))
        if not m or m.group(2) not in METRICS:
            raise ConfigError(f"SLO {text!r} does not parse",
                              f"write it as <p50|p95|p99|mean>_<{'|'.join(METRICS)}><=<number>, "
                              "e.g. p99_e2e_ms<=500")
        return cls(m.group(1), m.group(2), float(m.group(4)), text.strip())

    def value(self, level) -> float | None:
        values = level.values(self.metric)
        return self.of(values) if len(values) else None

    def of(self, values) -> float:
        """This SLO's statistic of some requests' values."""
        return float(np.mean(values)) if self.stat == "mean" else float(np.percentile(values, float(self.stat[1:])))

    def met_by(self, level) -> bool:
        v = self.value(level)
        return v is not None and v <= self.threshold


def parse_all(texts) -> list[SLO]:
    return [SLO.parse(t) for t in texts or []]


def applicable(slos: list[SLO], metrics) -> tuple[list[SLO], list[SLO]]:
    """(the SLOs on metrics this workload measures, the others): an encoder's request has no TTFT or TPOT."""
    return [s for s in slos if s.metric in metrics], [s for s in slos if s.metric not in metrics]


def request_meets(record, slos: list[SLO]) -> bool:
    """A request counts towards goodput when it succeeded and each of its own values is within every SLO."""
    if not record.ok:
        return False
    m = record.metrics()
    if any(s.metric == Metric.ITL_MS for s in slos) and len(record.token_times) > 1:
        m[Metric.ITL_MS] = max(record.itl_ms())
    return all(m.get(s.metric, 0.0) <= s.threshold for s in slos)


@dataclass(frozen=True)
class CapacityResult:
    concurrency: int | None            # the largest load that met every SLO (None: not even the lowest)
    levels: dict[int, object]          # every level measured on the way, by concurrency
    reason: str


def sla_capacity(measure: Callable[[int], object], ladder: list[int], slos: list[SLO],
                 on_probe: Callable[[int, bool], None] = lambda c, ok: None) -> CapacityResult:
    """Bracket on the ladder (stop at the first level that misses), then bisect between the bracket ends."""
    if not slos:
        raise ConfigError("SLA-capacity search needs at least one SLO", "set benchmark.slos, e.g. [p99_e2e_ms<=500]")
    measured: dict[int, object] = {}

    def ok(c: int) -> bool:
        if c not in measured:
            measured[c] = measure(c)
        passed = all(s.met_by(measured[c]) for s in slos)
        on_probe(c, passed)
        return passed

    best, failed = None, None
    for c in sorted(ladder):
        if ok(c):
            best = c
        else:
            failed = c
            break
    if best is None:
        return CapacityResult(None, measured, f"lowest level c={sorted(ladder)[0]} already misses the SLOs")
    if failed is None:
        return CapacityResult(best, measured, f"every level up to c={best} meets the SLOs (ceiling not reached)")
    lo, hi = best, failed
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return CapacityResult(lo, measured, f"c={lo} meets the SLOs, c={hi} misses")
