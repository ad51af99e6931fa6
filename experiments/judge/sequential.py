"""Two looks at an accuracy drop: decide on the first documents when they already tell, else score the rest.

Looking twice at the same confidence errs more often than it says, so each look gets a stricter bound. The
bounds spend the error as O'Brien and Fleming's (Lan & DeMets 1983's spending function): almost nothing at the
first look, which then decides only what is plain there (identical numerics change no document; a drop far
within the tolerance), and nearly the single-look bound at the last, where the extra documents buy the power a
harmless change needs (a quantized model flips a few answers each way; on 400 documents that noise alone kept
the upper bound above a 0.02 tolerance 40 % of the time).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, stats

from experiments.core.errors import ConfigError
from experiments.core.stats import min_rounds, signed_rank_critical


@functools.lru_cache(maxsize=32)
def bounds(fraction: float, confidence: float) -> tuple[float, float]:
    """(z needed at the first look, z needed at the last) for a one-sided test at `confidence` whose first look
    sees `fraction` of the last look's documents. A z-statistic computed on the first documents and on all of
    them correlates by sqrt(fraction); the last bound makes the chance of passing at either look exactly
    1 - confidence when the true drop equals the tolerance."""
    if not 0 < fraction < 1:
        raise ValueError(f"the first look's share of the documents must lie in (0, 1), not {fraction}")
    alpha = 1 - confidence
    first_alpha = 2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(fraction))
    if first_alpha <= 0:
        return math.inf, float(stats.norm.isf(alpha))   # a first look this small spends nothing: one look
    first = float(stats.norm.isf(first_alpha))
    rho = math.sqrt(fraction)
    joint = stats.multivariate_normal(mean=[0.0, 0.0], cov=[[1.0, rho], [rho, 1.0]], seed=0)
    last = optimize.brentq(lambda z: float(joint.cdf([first, z])) - confidence, 0.0, first + 10.0, xtol=1e-6)
    return first, float(last)


# --- interleaved rounds: looks at a growing number of rounds -------------------------------------------------
def round_looks(first: int, most: int | None) -> list[int]:
    """The round counts at which the gate looks: `first`, then `first` more at a time up to `most` (the last
    look may be shorter); one look when `most` is unset or not above `first`."""
    if not most or most <= first:
        return [first]
    return list(range(first, most, first)) + [most]


@functools.lru_cache(maxsize=32)
def look_alpha(confidence: float, looks: tuple[int, ...], draws: int = 100_000) -> float:
    """One-sided error each look accepts at, the same at every look (Pocock's shape), calibrated so that the
    chance of accepting at any of `looks` is at most the single look's (1 - confidence) / 2 when the true ratio
    is at the boundary (1 - min_gain).

    Exact in distribution, estimated by simulation: at the boundary the signed-rank statistics of the looks depend
    only on the rounds' signs (fair coins) and the ranks of their sizes, whatever the noise's shape, so normal
    draws give their joint law. The looks' statistics share their first rounds, so a Bonferroni split ((1 -
    confidence) / 2 / looks, the rule before this one) spent a third to a half of the error it was allowed."""
    if len(looks) == 1:
        return (1 - confidence) / 2
    target = 0.96 * (1 - confidence) / 2     # 2 standard errors of the simulation below the error allowed
    signs = np.random.default_rng(0).standard_normal((draws, looks[-1]))
    w_plus = np.stack([_w_plus(signs[:, :n]) for n in looks], axis=1)

    def accepts(alpha: float) -> float:
        k = np.array([_critical(n, alpha) for n in looks])
        return float(np.mean((w_plus <= k - 1).any(axis=1)))

    lo, hi = target / len(looks), target       # from Bonferroni's share (safe) to the single look's
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if accepts(mid) <= target else (lo, mid)
    return lo


def _w_plus(x: np.ndarray) -> np.ndarray:
    """Wilcoxon's W+ of each row: the sum of the ranks of |x| over its positive entries, which is also the count
    of its positive Walsh averages (the interval's upper bound is below 0 exactly when W+ <= k - 1)."""
    ranks = np.argsort(np.argsort(np.abs(x), axis=1), axis=1) + 1
    return (ranks * (x > 0)).sum(axis=1)


def _critical(rounds: int, alpha: float) -> int:
    """signed_rank_critical at one-sided alpha; 0 (no interval can accept) where rounds are too few for it."""
    try:
        return signed_rank_critical(rounds, 1 - 2 * alpha)
    except ValueError:
        return 0


def check_rounds(cfg_interleaved, confidence: float) -> None:
    """rounds: 0 (compare with the champion's recorded run) or enough for an exact interval at `confidence`.
    The settings' types and ranges are the settings table's (experiments/core/settings.py)."""
    rounds = cfg_interleaved.rounds
    fewest = min_rounds(confidence)
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0 or 0 < rounds < fewest:
        raise ConfigError(f"gate.interleaved.rounds={rounds!r} is not 0 or an integer >= {fewest}",
                          f"0 compares with the champion's recorded run; {fewest} or more re-measure it beside the "
                          f"challenger (the fewest whose signed-rank interval reaches {confidence:.0%}; 8-12 is "
                          f"a good default)")
    most = cfg_interleaved.get("max_rounds")
    if rounds and most is not None and most < rounds:
        raise ConfigError(f"gate.interleaved.max_rounds={most} is below gate.interleaved.rounds={rounds}",
                          "give the most rounds a comparison may take (>= rounds), or null for one look")
    looks = round_looks(rounds, most) if rounds else []
    if len(looks) > 1 and rounds < (fewest := min_rounds(1 - 2 * look_alpha(confidence, tuple(looks)))):
        raise ConfigError(f"gate.interleaved.rounds={rounds} is too few for a first of {len(looks)} looks: each "
                          f"look's share of the error needs {fewest} rounds for an exact interval",
                          f"raise rounds to {fewest}, or lower max_rounds (fewer looks)")
