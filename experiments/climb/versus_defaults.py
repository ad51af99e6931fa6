"""The sweep's last word: its champion against what a user would have run anyway, the best serving engine started
with its defaults (optimizers/engine_defaults.py), as one line for the console, the sweep's run and its table.

Each default was gated against the champion of its time; the champion may have climbed on since. So unless the
champion is that default, both are measured once more side by side, in interleaved rounds at the top concurrency
(each side alone in a process of its own, the same fresh prompts in each round), and the line gives the champion's
tokens/s and TPOT over the default's, per round, with their intervals (experiments/core/stats.rounds_ratio_ci).
A champion shown to serve fewer tokens/s than that default (the interval's upper bound below 1) gives way to it:
the sweep never ends on a champion a user would do better without. (The gate judges the objective, mean E2E over
the prompts both sides served in a round; in short rounds those are a run's first requests, where a server that
takes one request at a time looks better than it serves: ONNX Runtime INT8 passed llama-server's defaults on E2E
at c=8, 0.902 [0.880, 0.925], and served 0.88 [0.86, 0.91] of its tokens/s there.)
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.climb import contender
from experiments.climb.sweep import Sweep
from experiments.core.names import Metric
from experiments.core.stats import min_rounds, rounds_ratio_ci
from experiments.measure import interleaved, isolation
from experiments.record.outcome import RungOutcome
from experiments.serving import build_engine
from optimizers.engine_defaults import is_default

# what a default must have kept to count as something a user could run instead: what the model says
KEPT = ("accuracy", "fidelity", "generation_agreement")


def best_default(outcomes: list[RungOutcome], top: int) -> tuple[RungOutcome | None, list[str]]:
    """(the default with the most tokens/s at `top` among those that kept the model's answers, or None; why each
    other default does not count)."""
    kept, left_out = [], []
    for o in outcomes:
        if not is_default(o) or o.verdict.status == "skipped":
            continue
        lost = [c.name for c in o.verdict.criteria if c.name.split(":")[0] in KEPT and not c.passed]
        if o.bench is None:
            left_out.append(f"{o.name} was not measured ({o.verdict.status})")
        elif lost:
            left_out.append(f"{o.name} failed {', '.join(lost)}: a reference row only")
        else:
            kept.append(o)
    best = max(kept, key=lambda o: o.summary(top).get("throughput", 0.0), default=None)
    return best, left_out


@dataclass(frozen=True)
class Versus:
    line: str                               # what the console, the sweep's run and its table say ("" nothing)
    champion: RungOutcome | None            # the sweep's champion after it: the best default where it served more


def versus_defaults(outcomes: list[RungOutcome], champion: RungOutcome | None, sweep: Sweep, top: int) -> Versus:
    """"champion vs best default: ..." (or why there is none to say), measured side by side where they differ;
    the best default becomes the champion where the champion surely serves fewer tokens/s."""
    best, left_out = best_default(outcomes, top)
    note = f" ({'; '.join(left_out)})" if left_out else ""
    if best is None or champion is None:
        none = "champion vs best default: no engine default in this ladder kept the model's answers"
        return Versus(f"{none}{note}" if left_out and champion else "", champion)
    if champion is best:
        return Versus(f"champion vs best default: the champion is {best.name} itself; no rung climbed past it{note}",
                      champion)
    ratios, count = _side_by_side(champion, best, sweep, top)
    if count < min_rounds(sweep.cfg.gate.confidence):
        return Versus(f"champion vs best default ({best.name}): undecided, {count} rounds with both sides "
                      f"measured{note}", champion)
    tps, lo, hi = rounds_ratio_ci(ratios["tokens"], sweep.cfg.gate.confidence)
    tpot, tlo, thi = rounds_ratio_ci(ratios["tpot"], sweep.cfg.gate.confidence)
    line = (f"champion vs best default ({best.name}): ×{tps:.2f} [{lo:.2f}, {hi:.2f}] tokens/s at c={top}, TPOT "
            f"×{tpot:.2f} [{tlo:.2f}, {thi:.2f}] ({count} interleaved rounds){note}")
    if hi < 1:
        return Versus(f"{line}; {champion.name} serves surely fewer tokens/s than {best.name}, which is therefore "
                      f"the champion (a sweep never ends slower than a default)", best)
    return Versus(line, champion)


def _side_by_side(champion: RungOutcome, default: RungOutcome, sweep: Sweep, top: int) -> tuple[dict, int]:
    """Per-round ratios champion / default: tokens/s at c=top, and TPOT p50 over the prompts both served."""
    cfg = sweep.cfg
    rounds_cfg = cfg.gate.interleaved
    count = max(int(rounds_cfg.rounds or 0), min_rounds(cfg.gate.confidence))
    apart = contender.Apart(isolation.Limits.for_rung(cfg.isolation, "versus_defaults"), sweep.logs,
                            "versus_defaults")
    threads, artefacts = int(cfg.threads), Path(cfg.cache_dir) / "artefacts"
    builds = {who: functools.partial(build_engine, o.candidate, threads, artefacts)
              for who, o in (("champion", champion), ("default", default))}
    load = interleaved.load_config(cfg.benchmark, rounds_cfg, top)
    with sweep.ui.stage(f"the champion and {default.name} side by side, {count} rounds at c={top}") as st:
        with contender.round_runs(builds, False, sweep.workload, load, top, cfg.gate.confidence, apart, 1) as runs:
            rounds = interleaved.measure(runs, count, top, lambda r: st.progress(r, count, "rounds"),
                                         (int(cfg.seed), zlib.crc32(b"versus_defaults")))
    tokens = np.array([a.output_tokens_per_s / b.output_tokens_per_s if b.output_tokens_per_s else np.nan
                       for a, b in zip(rounds.runs["champion"], rounds.runs["default"])])
    tpot = rounds.ratios("champion", "default", Metric.TPOT_MS, "p50")
    ok = np.isfinite(tokens) & np.isfinite(tpot)
    return {"tokens": tokens[ok], "tpot": tpot[ok]}, int(ok.sum())
