"""A leak is growth that persists: memory over a soak, settled first, judged with its interval.

- settling: growth that levels off. From the start of the measured windows, and from later starts up to half of
  them, the series is split into its first quarter and the rest, each with its Theil-Sen slope: while the first
  quarter's lower bound is above the rest's upper bound, the growth is still levelling off (an allocator or a
  cache warming up: their growth comes early); the first start where it is not is where the series settled, or
  later where MSER (the marginal standard error rule, White 1997: the cut that minimises the variance of what is
  left over its length, at most half) puts the end of the transient. A soak of fewer than MIN_TELL windows
  cannot tell a settling allocator from a leak (12 windows of a 3-second soak called an allocator that settles
  over seconds a leak 9 times in 10: make bench-slo).
- the steady part: Theil-Sen slope of memory vs time (robust to the odd allocator jump), with its interval,
  projected over `horizon_h`; three answers, as the speed gate's:
  clean where the projection's upper bound is within `budget_mb`; LEAK where growth is shown (its lower bound
  above zero), the budget not shown kept, and the growth not levelling off; not decided otherwise (a soak too
  short for its interval to reach the budget, or one that ended while its growth still levelled off): the rung
  is not failed for it, and promotion asks for a longer soak.
- a declared cap (llama-server's --cache-ram): growth within the cap is a bounded cache filling, judged on the
  most it can hold against the machine's memory, not extrapolated past the cap.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from experiments.judge.gate import Criterion

MIN_POINTS = 3
MIN_PART = 4          # windows in each part of the levelling-off test
MIN_TELL = 24         # windows to tell growth that levels off from a leak
STARTS = 12           # later starts tried, at most


def settled_from(t_s, mb, confidence: float) -> tuple[int, bool | None]:
    """(where the growth stopped levelling off, True; or the last start tried and False if it never did within
    the first half; or 0 and None when the series is too short to tell)."""
    t, y = np.asarray(t_s, float), np.asarray(mb, float)
    if y.size < MIN_TELL:
        return 0, None
    last = y.size // 2          # MIN_TELL >= 4 x MIN_PART: the rest keeps both parts of the test
    starts = sorted(set(np.linspace(0, last, min(STARTS, last + 1)).astype(int).tolist()))
    for d in starts:
        if not levelling_off(t[d:], y[d:], confidence):
            return max(d, mser_cut(y)), True
    return starts[-1], False


def mser_cut(y: np.ndarray) -> int:
    most = min(y.size // 2, y.size - MIN_POINTS)
    return int(np.argmin([np.var(y[d:]) / (y.size - d) for d in range(most + 1)])) if most > 0 else 0


def levelling_off(t, y, confidence: float) -> bool:
    """The first quarter's slope (MIN_PART windows at least) surely above the rest's."""
    q = max(MIN_PART, y.size // 4)
    first, rest = stats.theilslopes(y[:q], t[:q], alpha=confidence), stats.theilslopes(y[q:], t[q:], alpha=confidence)
    return first.low_slope > rest.high_slope


def leak_check(name: str, t_s, mb, horizon_h: float, budget_mb: float, confidence: float,
               bound_mb: float | None = None, machine_mb: float | None = None) -> Criterion:
    """The leak verdict on memory (MB) vs time (s) after the soak's warm-up; `decided` in its numbers (1/0)."""
    t, y = np.asarray(t_s, float), np.asarray(mb, float)
    if t.size < MIN_POINTS:
        return Criterion(name, False, f"{name}: {t.size} points after the warm-up, too few to fit a slope")
    d, settled = settled_from(t, y, confidence)
    fit = stats.theilslopes(y[d:], t[d:], alpha=confidence)
    slope, low, high = (float(v) * 3600 for v in (fit.slope, fit.low_slope, fit.high_slope))
    projected, upper = slope * horizon_h, high * horizon_h
    numbers = {"slope_mb_per_h": slope, "slope_ci_low": low, "slope_ci_high": high, "projected_mb": projected,
               "projected_mb_high": upper, "budget_mb": float(budget_mb), "points": float(t.size - d),
               "settled_after_s": float(t[d] - t[0]), "settled_mb": float(y[d] - y[0])}
    clean, growing = upper <= budget_mb, low > 0
    if growing and not clean and bound_mb is not None:
        return bounded_check(name, y, bound_mb, budget_mb, machine_mb, slope, low, high)
    was = {True: f"settled at {y[d] - y[0]:+.0f} MB after {t[d] - t[0]:.0f} s, then " if d else "",
           False: f"still levelling off after {t[d] - t[0]:.0f} s, then ", None: ""}[settled]
    seen = (f"{name} {was}{slope:+.1f} MB/h [{low:+.1f}, {high:+.1f}] → {projected:+.1f} MB (at most "
            f"{upper:+.1f}) over {horizon_h:g} h vs budget {budget_mb:g} MB")
    span = float(t[-1] - t[0])
    if clean:
        return Criterion(name, True, f"{seen}: within budget", {**numbers, "decided": 1.0})
    if growing and settled:
        return Criterion(name, False, f"{seen}: LEAK, growing and the budget not shown kept",
                         {**numbers, "decided": 1.0})
    why = ("growing, but levelling off: a longer soak tells where it settles" if growing and settled is False else
           f"growing, but {t.size} windows are too few to tell growth that levels off from a leak" if growing else
           "no growth shown, the budget not shown kept either")
    return Criterion(name, True, f"{seen}: not decided by a {span:.0f}-second soak ({why})",
                     {**numbers, "decided": 0.0})


def bounded_check(name: str, mb, bound_mb: float, budget_mb: float, machine_mb: float | None, slope: float,
                  low: float, high: float) -> Criterion:
    """Growth of an engine with a capped cache: a leak only beyond the cap (and the budget); within it, judged on
    the most the engine can hold, what it held at the first measured window plus the cap, against `machine_mb`."""
    y = np.asarray(mb, float)
    grew, most = float(y.max() - y[0]), float(y[0] + bound_mb)
    numbers = {"slope_mb_per_h": slope, "slope_ci_low": low, "slope_ci_high": high, "grew_mb": grew,
               "cache_cap_mb": float(bound_mb), "most_mb": most, "budget_mb": float(budget_mb), "decided": 1.0}
    if grew > bound_mb + budget_mb:
        return Criterion(name, False, f"{name} grew {grew:+.0f} MB, beyond its cache's cap of {bound_mb:g} MB and "
                                      f"the {budget_mb:g} MB budget: LEAK", numbers)
    fits = machine_mb is None or most <= machine_mb
    where = "" if machine_mb is None else f" of the machine's {machine_mb:.0f} MB"
    return Criterion(name, fits, f"{name} bounded cache: grew {grew:+.0f} MB of its {bound_mb:g} MB cap ({slope:+.0f} "
                                 f"MB/h [{low:+.0f}, {high:+.0f}] while it fills); at the cap it holds {most:.0f} MB"
                                 f"{where}{'' if fits else ': DOES NOT FIT'}",
                     {**numbers, **({"machine_mb": machine_mb} if machine_mb is not None else {})})


def decided(criterion: Criterion) -> bool:
    """Whether a leak check (or a soak criterion that holds one) decided; a check without the number did."""
    return all(v != 0.0 for k, v in criterion.numbers.items() if k == "decided" or k.endswith("/decided"))
