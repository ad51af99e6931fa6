"""Challenger vs champion: every criterion with its numbers, never a bare boolean."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from experiments.accuracy import AccuracyReport
from experiments.benchmark import BenchmarkReport
from experiments.stats import ratio_ci


@dataclass(frozen=True)
class Criterion:
    name: str
    passed: bool
    detail: str
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    status: str                      # accepted | rejected | skipped | failed
    reason: str
    criteria: tuple[Criterion, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    @classmethod
    def from_criteria(cls, criteria: list[Criterion]) -> "Verdict":
        failed = [c for c in criteria if not c.passed]
        if failed:
            return cls("rejected", "; ".join(c.detail for c in failed), tuple(criteria))
        return cls("accepted", "; ".join(c.detail for c in criteria), tuple(criteria))


class Gate:
    def __init__(self, cfg, seed: int = 0):
        self.cfg = cfg
        self.seed = seed

    def performance(self, champion: BenchmarkReport, challenger: BenchmarkReport) -> Criterion:
        obj = self.cfg.objective
        metric, stat = obj.metric, obj.stat
        level = max(lv.concurrency for lv in champion.levels) if obj.concurrency == "max" else int(obj.concurrency)
        a = challenger.level(level).values(metric)
        b = champion.level(level).values(metric)
        if len(a) < 2 or len(b) < 2:
            return Criterion("performance", False, f"too few successful requests at c={level} to compare "
                                                   f"({len(a)} vs {len(b)})")
        ratio, lo, hi = ratio_ci(a, b, stat, self.cfg.confidence, self.cfg.bootstrap_resamples, self.seed)
        need = 1 - self.cfg.min_gain
        passed = hi < need
        label = f"{metric} {stat} @c={level}"
        detail = (f"{label} ratio {ratio:.3f} [{lo:.3f}, {hi:.3f}] "
                  f"{'<' if passed else '>='} {need:.2f} needed")
        return Criterion("performance", passed, detail,
                         {"ratio": ratio, "ratio_ci_low": lo, "ratio_ci_high": hi, "ratio_needed": need})

    def slos(self, champion: BenchmarkReport, challenger: BenchmarkReport) -> Criterion:
        """Every SLO still met at each level where the champion met them all."""
        slos = champion.slos
        if not slos:
            return Criterion("slos", True, "no SLOs configured")
        lost = []
        for lv in champion.levels:
            if all(s.met_by(lv) for s in slos):
                mine = challenger.level(lv.concurrency)
                lost += [f"{s.text} at c={lv.concurrency} ({s.value(mine):.1f})" for s in slos if not s.met_by(mine)]
        if lost:
            return Criterion("slos", False, "SLO no longer met: " + ", ".join(lost), {"slos_lost": len(lost)})
        return Criterion("slos", True, "SLOs held", {"slos_lost": 0})

    def accuracy(self, champion: AccuracyReport, challenger: AccuracyReport) -> Criterion:
        """Paired on the same documents: drop = mean(champion - challenger) per doc, upper bound vs tolerance."""
        a, b = np.asarray(champion.per_doc), np.asarray(challenger.per_doc)
        if a.shape != b.shape:
            return Criterion("accuracy", False, f"{champion.task}: scored {len(b)} docs, champion {len(a)}")
        diff = a - b
        drop = float(diff.mean())
        se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
        z = stats.norm.ppf(self.cfg.confidence)
        upper = drop + z * se
        tol = self.cfg.accuracy.max_drop_abs
        passed = upper <= tol
        detail = (f"{champion.task} {champion.metric} {challenger.value:.3f} vs {champion.value:.3f}: "
                  f"drop {drop:+.3f} (upper {upper:+.3f}) {'<=' if passed else '>'} {tol}")
        return Criterion("accuracy", passed, detail, {"drop": drop, "drop_se": se, "drop_upper": upper,
                                                      "tolerance": tol})
