"""The SLO criterion: a challenger loses an SLO only where it is shown over the bound that the champion kept.

One tail sample must not decide: each side's statistic carries its interval (a percentile the distribution-free
order-statistic interval of scipy.stats.quantile_test, a mean its t interval), and an SLO is
- lost where the champion's estimate is within the bound and the challenger's lower bound is over it,
- held where the challenger's upper bound is within it,
- undecided otherwise (its interval straddles the bound, or its level has too few requests to bound that
  percentile): said with both sides' figures, never a rejection.
At the gate's objective level both sides' requests come from the interleaved rounds, pooled (the same load, side
by side, over the same minutes); at the other levels, where no rounds run, from each side's recorded run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from experiments.core.slo import SLO
from experiments.judge.gate import Criterion

HELD, LOST, UNDECIDED, NOT_KEPT = "held", "lost", "undecided", "not kept by the champion"


@dataclass(frozen=True)
class Estimate:
    """One side's statistic at one level: its value and the interval (NaN where too few requests bound it)."""
    value: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values, slo: SLO, confidence: float) -> "Estimate":
        x = np.asarray(values, float)
        if x.size == 0:
            return cls(math.nan, math.nan, math.nan, 0)
        if slo.stat != "mean":
            low, high = stats.quantile_test(x, p=float(slo.stat[1:]) / 100).confidence_interval(confidence)
        elif x.size > 1:
            low, high = stats.ttest_1samp(x, 0.0).confidence_interval(confidence)
        else:
            low, high = math.nan, math.nan
        return cls(slo.of(x), float(low), float(high), int(x.size))

    def text(self) -> str:
        bound = lambda v: "–" if math.isnan(v) else f"{v:.1f}"   # noqa: E731
        return f"{bound(self.value)} [{bound(self.low)}, {bound(self.high)}] of {self.n} requests"


@dataclass(frozen=True)
class SloCall:
    """One SLO at one level, both sides' estimates, and what they show."""
    slo: SLO
    concurrency: int
    source: str                  # "rounds" (pooled, side by side) or "recorded runs"
    champion: Estimate
    challenger: Estimate

    @property
    def status(self) -> str:
        bound = self.slo.threshold
        if not self.champion.value <= bound:
            return NOT_KEPT
        if self.challenger.low > bound:
            return LOST
        if self.challenger.high <= bound:
            return HELD
        return UNDECIDED

    def text(self) -> str:
        why = ""
        if self.status == UNDECIDED:
            why = (": too few requests to bound it" if math.isnan(self.challenger.high) else
                   ": its interval straddles the bound")
        return (f"{self.slo.text} at c={self.concurrency} ({self.source}): challenger {self.challenger.text()} vs "
                f"champion {self.champion.text()}{why}")


def calls(champion, challenger, slos: list[SLO], confidence: float, rounds=None) -> list[SloCall]:
    """Every SLO at every level the two benchmark reports share; the rounds' level from the rounds."""
    out = []
    for level in champion.levels:
        c = level.concurrency
        if rounds is not None and rounds.concurrency == c:
            out += rounds_calls(slos, confidence, rounds)
            continue
        try:
            mine = challenger.level(c)
        except KeyError:
            continue
        out += [SloCall(slo, c, "recorded runs", Estimate.of(level.values(slo.metric), slo, confidence),
                        Estimate.of(mine.values(slo.metric), slo, confidence)) for slo in slos]
    return out


def rounds_calls(slos: list[SLO], confidence: float, rounds) -> list[SloCall]:
    """Every SLO at the rounds' level, on both sides' requests pooled over the rounds."""
    return [SloCall(slo, rounds.concurrency, "rounds",
                    Estimate.of(pooled(rounds, "champion", slo.metric), slo, confidence),
                    Estimate.of(pooled(rounds, "challenger", slo.metric), slo, confidence)) for slo in slos]


def pooled(rounds, side: str, metric: str) -> np.ndarray:
    return np.concatenate([lv.values(metric) for lv in rounds.runs[side]] or [np.empty(0)])


def criterion(champion, challenger, confidence: float, rounds=None) -> Criterion:
    """Lost SLOs fail; undecided ones are said, with both sides' figures, and fail nothing."""
    slos = champion.slos
    if not slos:
        return Criterion("slos", True, "no SLOs configured")
    found = calls(champion, challenger, slos, confidence, rounds)
    by = {s: [k for k in found if k.status == s] for s in (HELD, LOST, UNDECIDED, NOT_KEPT)}
    numbers = {"slos_lost": float(len(by[LOST])), "slos_undecided": float(len(by[UNDECIDED])),
               "slos_held": float(len(by[HELD]))}
    if by[LOST]:
        return Criterion("slos", False, "SLO shown lost: " + "; ".join(k.text() for k in by[LOST]), numbers)
    held = f"SLOs held ({len(by[HELD])} shown within their bound"
    if not by[UNDECIDED]:
        return Criterion("slos", True, held + ")", numbers)
    return Criterion("slos", True, f"{held}, none shown lost; undecided: "
                                   + "; ".join(k.text() for k in by[UNDECIDED]) + ")", numbers)


def undecided_in_rounds(champion, confidence: float, rounds) -> bool:
    """Whether more rounds could decide an SLO at the rounds' level (one the champion keeps there)."""
    return any(k.status == UNDECIDED for k in rounds_calls(champion.slos, confidence, rounds))
