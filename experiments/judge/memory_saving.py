"""A rung that aims at memory (`aim: memory` in its conf/rung file: a KV cache in fewer bits) is judged on the
memory it saves, beside a speed that must not fall (Gate.aimed_at("memory")): a deployment short of memory takes
the same speed in less of it, where a speed gate would reject it as "no gain".

Memory is read in the same rounds as speed, each side's peak per round: one reading per run would compare two
moments minutes apart, and a server's memory grows with what it has served (caches, allocator pools)."""
from __future__ import annotations

import math

import numpy as np

from experiments.core.stats import min_rounds, rounds_ratio_ci
from experiments.judge.gate import Criterion

# The process's own GPU memory where the driver reports it, else the device's; else the RSS of the engine's
# processes (a serving engine's server: all of them).
MEASURES = (("gpu_proc_mem_mb_max", "GPU memory"), ("gpu_mem_mb_max", "device GPU memory"), ("rss_mb_max", "RSS"))


def on_rounds(rounds, cfg_gate, challenger: str = "challenger", champion: str = "champion") -> Criterion:
    """Each round's peak memory, challenger / champion: Hodges-Lehmann with its signed-rank interval over the
    rounds (as the speed ratio); its upper bound must be below 1 - memory.min_saving."""
    mine, theirs = rounds.runs[challenger], rounds.runs[champion]
    what, key = measure(mine + theirs)
    ratios = np.array([_mb(a, key) / _mb(b, key) for a, b in zip(mine, theirs)])
    confidence = float(cfg_gate.confidence)
    if len(ratios) < min_rounds(confidence) or not np.isfinite(ratios).all():
        return Criterion("memory", False, f"memory: a round without a {what} reading, or too few rounds for a "
                                          f"{confidence:.0%} interval ({np.round(ratios, 3).tolist()})")
    ratio, lo, hi = rounds_ratio_ci(ratios, confidence)
    mb = (float(np.median([_mb(a, key) for a in mine])), float(np.median([_mb(b, key) for b in theirs])))
    return _judged(ratio, lo, hi, f"{what} peak {mb[0]:,.0f} vs {mb[1]:,.0f} MB (medians over {len(ratios)} "
                                  f"rounds), ratio", mb, cfg_gate)


def on_recorded(champion, challenger, concurrency: int, cfg_gate) -> Criterion:
    """Against the champion's recorded run (gate.interleaved.rounds: 0): each run's peak at the objective's
    concurrency, one reading each, so no interval."""
    mine, theirs = challenger.level(concurrency), champion.level(concurrency)
    what, key = measure((mine, theirs))
    mb = (_mb(mine, key), _mb(theirs, key))
    ratio = mb[0] / mb[1]
    return _judged(ratio, ratio, ratio, f"{what} peak @c={concurrency} {mb[0]:,.0f} vs {mb[1]:,.0f} MB (one run "
                                        f"each), ratio", mb, cfg_gate)


def out_of_reach(criterion: Criterion, cfg_gate) -> bool:
    """No more rounds can pass it: the saving's interval already excludes the saving needed (or no reading)."""
    return not criterion.numbers.get("memory_ratio_ci_low", math.inf) < 1 - float(cfg_gate.memory.min_saving)


def measure(levels) -> tuple[str, str]:
    """(what is compared, the level's field): the first of MEASURES that every level has."""
    for key, what in MEASURES:
        if all(getattr(lv, key) for lv in levels):
            return what, key
    return "RSS", "rss_mb_max"


def _mb(level, key: str) -> float:
    return float(getattr(level, key) or math.nan)


def _judged(ratio: float, lo: float, hi: float, label: str, mb: tuple[float, float], cfg_gate) -> Criterion:
    need = 1 - float(cfg_gate.memory.min_saving)
    passed = bool(hi < need)
    detail = f"{label} {ratio:.3f} [{lo:.3f}, {hi:.3f}] {'<' if passed else '>='} {need:.2f} needed"
    return Criterion("memory", passed, detail, {"memory_ratio": ratio, "memory_ratio_ci_low": lo,
                                                "memory_ratio_ci_high": hi, "memory_ratio_needed": need,
                                                "memory_mb_challenger": mb[0], "memory_mb_champion": mb[1]})
