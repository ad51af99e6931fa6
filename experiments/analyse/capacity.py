"""Capacity and cost: how many replicas a target peak needs at an SLA tier, and what that costs.

replicas = ceil(ceil(peak QPS x mean request duration / per-replica capacity at the SLA) x headroom), where
the per-replica capacity is the largest measured concurrency that met the tier's SLOs (the SLA-capacity
search's answer when it ran) and the mean request duration is the mean E2E at that concurrency.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from experiments.core.errors import ConfigError
from experiments.core.names import Metric
from experiments.core.settings import check_section
from experiments.core.slo import parse_all


@dataclass(frozen=True)
class CapacityPlan:
    tier: str
    slos: tuple[str, ...]
    concurrency_at_sla: int
    mean_request_s: float
    qps_per_replica: float
    mean_output_tokens: float
    replicas: int
    devices_per_replica: int           # tensor x pipeline parallel: what one replica occupies
    devices: int
    cost_per_hour: float
    cost_per_million_output_tokens: float
    scale_up_queue_depth: int
    scale_down_queue_depth: int
    note: str

    def to_metrics(self) -> dict[str, float]:
        return {f"capacity/{k}": float(v) for k, v in asdict(self).items() if isinstance(v, (int, float))}

    def to_markdown(self) -> str:
        rows = [f"| {k} | {v} |" for k, v in asdict(self).items()]
        return "| capacity plan | value |\n|---|---|\n" + "\n".join(rows) + "\n"


def check_config(cfg) -> list:
    """The tier's SLOs, after checking the inputs (before any long work)."""
    if cfg.sla_tier not in cfg.tiers:
        raise ConfigError(f"capacity.sla_tier {cfg.sla_tier!r} is unknown", f"use one of {list(cfg.tiers)}")
    check_section(cfg, "capacity")
    return parse_all(cfg.tiers[cfg.sla_tier])


def plan(bench, cfg, devices_per_replica: int = 1) -> CapacityPlan:
    """price_per_replica_hour is a one-device replica's: a replica over N devices costs N times as much."""
    slos = check_config(cfg)
    meeting = [lv for lv in bench.levels if lv.n_ok and all(s.met_by(lv) for s in slos)]
    if not meeting:
        raise ValueError(f"no measured level meets the {cfg.sla_tier} tier ({', '.join(s.text for s in slos)})")
    best = max(meeting, key=lambda lv: lv.concurrency if slos else lv.qps)
    note = "largest measured concurrency meeting the tier's SLOs"
    if best is bench.levels[-1] and slos:
        note += " (the highest level measured: a lower bound on capacity)"
    e2e_s = float(best.values(Metric.E2E_MS).mean()) / 1e3
    out_tokens = float(best.values("output_tokens").mean())
    base = math.ceil(cfg.peak_qps * e2e_s / best.concurrency - 1e-9)
    replicas = math.ceil(base * cfg.headroom - 1e-9)
    cost_hour = replicas * devices_per_replica * cfg.price_per_replica_hour
    tokens_hour = cfg.peak_qps * out_tokens * 3600
    auto = cfg.autoscaling
    return CapacityPlan(
        tier=cfg.sla_tier, slos=tuple(s.text for s in slos), concurrency_at_sla=best.concurrency,
        mean_request_s=e2e_s, qps_per_replica=best.concurrency / e2e_s, mean_output_tokens=out_tokens,
        replicas=replicas, devices_per_replica=devices_per_replica, devices=replicas * devices_per_replica,
        cost_per_hour=cost_hour, cost_per_million_output_tokens=cost_hour / tokens_hour * 1e6,
        scale_up_queue_depth=max(1, math.ceil(auto.scale_up_fraction * best.concurrency)),
        scale_down_queue_depth=math.floor(auto.scale_down_fraction * best.concurrency), note=note)
