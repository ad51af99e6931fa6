"""A rung that aims at memory (`aim: memory` in its conf/rung file: a KV cache in fewer bits) is judged on the
memory it saves, beside a speed that must not fall (Gate.aimed_at("memory")): a deployment short of memory takes
the same speed in less of it, where a speed gate would reject it as "no gain".

Memory is read in the same rounds as speed, each side's peak per round: one reading per run would compare two
moments minutes apart, and a server's memory grows with what it has served (caches, allocator pools). With
several looks, memory is judged at each look's calibrated error, as speed is (experiments/judge/sequential.py):
the rounds stop once both pass, or either cannot."""
from __future__ import annotations

import math

import numpy as np

from experiments.core.stats import min_rounds, rounds_ratio_ci
from experiments.judge.gate import Criterion, Gate

# On a GPU the device memory of the engine's processes (a server's: all of them), where the driver reports it;
# the device-wide figure would also hold the paused rival, which stays resident between its runs.
NO_GPU_FIGURE = ("on a GPU, the driver reports no per-process memory here (a container's PID namespace, or a MIG "
                 "or vGPU device), and the device-wide figure holds both sides (the paused one stays resident)")


def on_rounds(rounds, gate: Gate, challenger: str = "challenger", champion: str = "champion") -> Criterion:
    """Each round's peak memory, challenger / champion: Hodges-Lehmann with its signed-rank interval over the
    rounds (as the speed ratio); its upper bound must be below 1 - memory.min_saving, at the look's error where
    the gate looks several times."""
    mine, theirs = rounds.runs[challenger], rounds.runs[champion]
    what, key = measure(mine + theirs)
    if key is None:
        return Criterion("memory", False, f"memory: not compared: {what}")
    ratios = np.array([_mb(a, key) / _mb(b, key) for a, b in zip(mine, theirs)])
    confidence = float(gate.cfg.confidence)
    if len(ratios) < min_rounds(confidence) or not np.isfinite(ratios).all():
        return Criterion("memory", False, f"memory: a round without a {what} reading, or too few rounds for a "
                                          f"{confidence:.0%} interval ({np.round(ratios, 3).tolist()})")
    ratio, lo, hi = rounds_ratio_ci(ratios, confidence)
    mb = (float(np.median([_mb(a, key) for a in mine])), float(np.median([_mb(b, key) for b in theirs])))
    label = f"{what} peak {mb[0]:,.0f} vs {mb[1]:,.0f} MB (medians over {len(ratios)} rounds), ratio"
    at_look = gate.look_bounds(ratios)
    if at_look is None:
        return _judged(ratio, lo, hi, hi, lo, label, mb, gate.cfg)
    alpha, low, bound, look, looks = at_look
    return _judged(ratio, lo, hi, bound, low, label, mb, gate.cfg,
                   f"; look {look} of {looks}: upper bound {bound:.3f} at one-sided {alpha:.4f}")


def on_recorded(champion, challenger, gate: Gate) -> Criterion:
    """Against the champion's recorded run (gate.interleaved.rounds: 0): each run's peak at the objective's
    concurrency, one reading each, so no interval."""
    concurrency = gate.objective_concurrency(champion)
    mine, theirs = challenger.level(concurrency), champion.level(concurrency)
    what, key = measure((mine, theirs))
    if key is None:
        return Criterion("memory", False, f"memory: not compared: {what}")
    mb = (_mb(mine, key), _mb(theirs, key))
    ratio = mb[0] / mb[1]
    return _judged(ratio, ratio, ratio, ratio, ratio, f"{what} peak @c={concurrency} {mb[0]:,.0f} vs {mb[1]:,.0f} MB "
                                                      f"(one run each), ratio", mb, gate.cfg)


def decided(gate: Gate, rounds) -> bool:
    """Stop adding rounds (a look before the last): both pass at this look; or either cannot pass any more — the
    slowdown allowed shown exceeded, or the saving needed shown out of reach."""
    obj = gate.cfg.objective
    ratios = rounds.ratios("challenger", "champion", obj.metric, obj.stat)
    speed, memory = gate.on_ratios(ratios), on_rounds(rounds, gate)
    if "memory_ratio_low" not in memory.numbers:
        return True                           # a round without a reading: no look can pass
    # the gate's own rule for speed alone (Gate.ratios_decided): decided and not passed is lost
    speed_lost = not speed.passed and gate.ratios_decided(ratios)
    memory_lost = memory.numbers["memory_ratio_low"] >= memory.numbers["memory_ratio_needed"]
    return (speed.passed and memory.passed) or speed_lost or memory_lost


def measure(levels) -> tuple[str, str | None]:
    """(what is compared, the level's field): the engine's processes' GPU memory where every level has it; on a
    GPU without that figure, (why not, None); else their RSS."""
    if all(lv.gpu_proc_mem_mb_max for lv in levels):
        return "GPU memory", "gpu_proc_mem_mb_max"
    if any(lv.gpu_mem_mb_max for lv in levels):
        return NO_GPU_FIGURE, None
    return "RSS", "rss_mb_max"


def _mb(level, key: str) -> float:
    return float(getattr(level, key) or math.nan)


def _judged(ratio: float, lo: float, hi: float, bound: float, low: float, label: str, mb: tuple[float, float],
            cfg_gate, look: str = "") -> Criterion:
    """`bound`/`low`: the interval's ends at the error the decision is taken at (the look's, or the single one's)."""
    need = 1 - float(cfg_gate.memory.min_saving)
    passed = bool(bound < need)
    detail = f"{label} {ratio:.3f} [{lo:.3f}, {hi:.3f}]{look} {'<' if passed else '>='} {need:.2f} needed"
    return Criterion("memory", passed, detail, {"memory_ratio": ratio, "memory_ratio_ci_low": lo,
                                                "memory_ratio_ci_high": hi, "memory_ratio_bound": bound,
                                                "memory_ratio_low": low, "memory_ratio_needed": need,
                                                "memory_mb_challenger": mb[0], "memory_mb_champion": mb[1]})
