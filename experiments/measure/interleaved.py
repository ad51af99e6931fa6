"""Champion and challenger measured in alternating rounds on the same load, so drift hits both.

Two runs taken minutes apart differ by whatever the machine did in between (a neighbour's job, a thermal step,
a page-cache flush), and a bootstrap over the requests of each run cannot see that: it is one draw per run.
Here each round measures every server at the gate's concurrency, and the gate judges the spread of the per-round
ratios: a rank-based interval over rounds (experiments/core/stats.py), whose width contains the run-to-run variation
instead of assuming it away. The order is balanced and drawn: in each block of rounds every contender goes first
once (AB then BA, or BA then AB), so a steady drift hits both sides alike, and the blocks are drawn at random, so
a disturbance that recurs at a fixed period cannot line up with one side as it could with AB, BA, AB, BA.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from omegaconf import OmegaConf

from experiments.core.names import Metric
from experiments.core.reports import LevelReport
from experiments.core.stats import summary_stat


@dataclass(frozen=True)
class Rounds:
    concurrency: int
    runs: dict[str, tuple[LevelReport, ...]]   # server name -> its level in each round, in round order
    first: tuple[str, ...] = ()                # who went first in each round

    @property
    def count(self) -> int:
        return min(len(levels) for levels in self.runs.values())

    def ratios(self, challenger: str, champion: str, metric: str, stat: str) -> np.ndarray:
        """stat(challenger) / stat(champion) per round, over the prompts both served in that round (each run
        starts at the same prompt, but a slower one gets through fewer in its seconds: a prompt mix that
        differed at the tail would add noise that is not speed). NaN for a round with nothing in common."""
        out = []
        for a, b in zip(self.runs[challenger], self.runs[champion]):
            x, y = _by_prompt(a, metric), _by_prompt(b, metric)
            common = sorted(x.keys() & y.keys())
            if not common:
                out.append(np.nan)
                continue
            xs, ys = np.array([x[i] for i in common]), np.array([y[i] for i in common])
            out.append(float(summary_stat(xs, stat) / summary_stat(ys, stat)))
        return np.array(out)

    def to_csv(self, metric: str, stat: str) -> str:
        names = list(self.runs)
        lines = ["round,first," + ",".join(f"{n}_{metric}_{stat},{n}_requests" for n in names)]
        for r in range(self.count):
            cells = [self.first[r] if r < len(self.first) else ""]
            for n in names:
                values = self.runs[n][r].values(metric)
                cells += [f"{summary_stat(values, stat):.4f}" if len(values) else "", str(len(values))]
            lines.append(f"{r}," + ",".join(cells))
        return "\n".join(lines) + "\n"


def _by_prompt(level: LevelReport, metric: str) -> dict[int, float]:
    """Each prompt's first successful request in the run -> its metric."""
    if metric == Metric.ITL_MS:
        metric = Metric.TPOT_MS      # one value per request to pair: the mean of its ITLs, its TPOT
    out: dict[int, float] = {}
    for rec in level.records:
        if rec.ok and rec.prompt.id not in out:
            value = rec.metrics().get(metric)
            if value is not None:
                out[rec.prompt.id] = value
    return out


def load_config(cfg_benchmark, cfg_interleaved, concurrency: int):
    """The benchmark's settings for one run of a round: closed loop at `concurrency`, after the warm-up,
    for `seconds` and at least `min_requests` requests."""
    return OmegaConf.merge(cfg_benchmark, {"mode": "closed", "concurrency": [concurrency],
                                           "min_duration_s": float(cfg_interleaved.seconds),
                                           "min_requests": int(cfg_interleaved.min_requests)})


def orders(names: list[str], rounds: int, seed) -> list[list[str]]:
    """Each round's order: blocks of len(names) rounds in which each contender goes first once (a rotation of
    `names`), the rotations of a block in an order drawn from `seed`."""
    rng = np.random.default_rng(seed)
    n, out = len(names), []
    while len(out) < rounds:
        out += [names[s:] + names[:s] for s in rng.permutation(n)]
    return out[:rounds]


def measure(runs: dict[str, Callable[[], LevelReport]], rounds: int, concurrency: int,
            on_round=lambda r: None, seed=0, looks=(), decided=lambda rounds: False,
            budget_s: float | None = None, needed=None) -> Rounds:
    """`rounds` rounds; each calls every contender's run once, in the order orders() draws from `seed`. With
    `looks` (round counts below `rounds`), decided(the rounds so far) is asked at each, and the rounds stop once
    it says so, or once a look finds `budget_s` spent. needed(the rounds so far), when given, names at each look
    the contenders still to measure (make bench-gate's, whose comparisons end one by one); the rest of the rounds
    draw their order among those.

    runs[name]() measures one run of that contender and returns its level, in a process where that contender is
    the only engine alive (experiments/climb/contender.py).
    """
    names = list(runs)
    levels: dict[str, list[LevelReport]] = {n: [] for n in names}
    first, started = [], time.monotonic()
    so_far = lambda: Rounds(concurrency, {n: tuple(found) for n, found in levels.items()}, tuple(first))  # noqa: E731
    plan = orders(names, int(rounds), seed)
    for r in range(int(rounds)):
        if r in looks:
            if decided(so_far()) or (budget_s is not None and time.monotonic() - started > budget_s):
                break
            if needed is not None and (active := [n for n in names if n in needed(so_far())]) != names:
                names = active
                plan = plan[:r] + orders(names, int(rounds) - r, (*np.ravel(seed).tolist(), r))
        on_round(r)
        first.append(plan[r][0])
        for name in plan[r]:
            levels[name].append(runs[name]())
    return so_far()
