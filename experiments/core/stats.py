"""Latency statistics as value objects: percentiles with distribution-free confidence intervals."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy import stats

PERCENTILE_METHOD = "numpy 'linear' interpolation (Hyndman-Fan type 7)"
CI_METHOD = "order-statistic interval from the binomial distribution (distribution-free)"
MIN_SAMPLES_FOR_P99 = 100


@dataclass(frozen=True)
class Quantile:
    q: float
    value: float
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True)
class LatencyStats:
    n: int
    mean: float
    p50: Quantile
    p95: Quantile
    p99: Quantile | None      # None below MIN_SAMPLES_FOR_P99: no P99 claim on too few samples
    confidence: float

    @classmethod
    def from_samples(cls, values, confidence: float = 0.95) -> "LatencyStats | None":
        x = np.sort(np.asarray(values, dtype=float))
        if x.size == 0:
            return None
        p99 = quantile(x, 0.99, confidence) if x.size >= MIN_SAMPLES_FOR_P99 else None
        return cls(n=int(x.size), mean=float(x.mean()), p50=quantile(x, 0.50, confidence),
                   p95=quantile(x, 0.95, confidence), p99=p99, confidence=confidence)

    def stat(self, name: str) -> float | None:
        if name == "mean":
            return self.mean
        q = getattr(self, name)
        return None if q is None else q.value


def quantile(sorted_values: np.ndarray, q: float, confidence: float) -> Quantile:
    """Point estimate plus the interval [x_(l), x_(u)] whose ranks come from Binomial(n, q)."""
    n = sorted_values.size
    value = float(np.percentile(sorted_values, q * 100, method="linear"))
    alpha = 1 - confidence
    lo_rank = int(stats.binom.ppf(alpha / 2, n, q))          # 0-based index of the lower bound
    hi_rank = int(stats.binom.ppf(1 - alpha / 2, n, q))       # 0-based index of the upper bound
    if lo_rank < 1 or hi_rank >= n:
        # Too few samples for a two-sided interval at this quantile.
        return Quantile(q, value, None, None)
    return Quantile(q, value, float(sorted_values[lo_rank - 1]), float(sorted_values[hi_rank]))


def ratio_ci(challenger, champion, stat: str, confidence: float, resamples: int, seed: int):
    """Bootstrap (percentile) interval for stat(challenger) / stat(champion), independent samples."""
    a, b = np.asarray(challenger, float), np.asarray(champion, float)

    def statistic(x, y, axis=-1):
        return summary_stat(x, stat, axis) / summary_stat(y, stat, axis)

    point = float(statistic(a, b))
    res = stats.bootstrap((a, b), statistic, n_resamples=resamples, confidence_level=confidence,
                          method="percentile", vectorized=True, paired=False,
                          random_state=np.random.default_rng(seed))
    return point, float(res.confidence_interval.low), float(res.confidence_interval.high)


def rounds_ratio_ci(ratios, confidence: float) -> tuple[float, float, float]:
    """(estimate, low, high) of per-round ratios: Hodges-Lehmann on their logs, with the exact Wilcoxon
    signed-rank interval; rounds are the replicates.

    Each round's ratio carries both request-to-request noise and whatever drifted between rounds, so the
    interval covers run-to-run variation that a bootstrap within one pair of runs cannot see. Rank-based,
    because on a shared machine a round now and then catches a neighbour's burst: one such round moves a
    mean (and widens a t-interval) far more than it moves this estimate.
    """
    estimate, lo, hi = hodges_lehmann_ci(np.log(np.asarray(ratios, float)), confidence)
    return float(np.exp(estimate)), float(np.exp(lo)), float(np.exp(hi))


def hodges_lehmann_ci(values, confidence: float) -> tuple[float, float, float]:
    """Median of the Walsh averages (x_i + x_j) / 2, i <= j, and the order statistics of those averages that
    the exact null distribution of Wilcoxon's signed-rank statistic puts at `confidence` (at least)."""
    x = np.asarray(values, float)
    n = len(x)
    k = signed_rank_critical(n, confidence)
    walsh = np.sort((x[:, None] + x[None, :])[np.triu_indices(n)] / 2)
    return float(np.median(walsh)), float(walsh[k - 1]), float(walsh[len(walsh) - k])


@functools.lru_cache(maxsize=256)
def signed_rank_critical(n: int, confidence: float) -> int:
    """The largest k with P(T <= k - 1) <= (1 - confidence) / 2 under the null (T: Wilcoxon's signed-rank
    statistic of n values; exact, by counting the subsets of ranks 1..n per sum). The interval from the k-th
    smallest to the k-th largest Walsh average then has coverage >= confidence."""
    ways = np.zeros(n * (n + 1) // 2 + 1)
    ways[0] = 1.0
    for rank in range(1, n + 1):
        ways[rank:] = ways[rank:] + ways[:-rank].copy()
    tail = np.cumsum(ways) / 2.0 ** n
    k = int(np.searchsorted(tail, (1 - confidence) / 2, side="right"))
    if k == 0:
        raise ValueError(f"{n} rounds cannot give a {confidence:.0%} interval (one-sided tail 1/2^{n} = "
                         f"{1 / 2 ** n:.3f} > {(1 - confidence) / 2:.3f}): use at least {min_rounds(confidence)}")
    return k


def min_rounds(confidence: float) -> int:
    """The fewest rounds whose exact signed-rank interval reaches `confidence`."""
    n = 1
    while 1 / 2 ** n > (1 - confidence) / 2:
        n += 1
    return n


def summary_stat(x, stat: str, axis=-1):
    """mean, or a percentile named pNN."""
    if stat == "mean":
        return np.mean(x, axis=axis)
    return np.percentile(x, float(stat.lstrip("p")), axis=axis)
