"""Champion and challenger measured in alternating rounds on the same load, so drift hits both.

Two runs taken minutes apart differ by whatever the machine did in between (a neighbour's job, a thermal step,
a page-cache flush), and a bootstrap over the requests of each run cannot see that: it is one draw per run.
Here each round measures every server at the gate's concurrency, in an order that rotates from round to round
(AB, BA, AB, ... ), and the gate judges the spread of the per-round ratios: a rank-based interval over
rounds (experiments/stats.py), whose width contains the run-to-run variation instead of assuming it away.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from omegaconf import OmegaConf

from experiments.level import LevelReport
from experiments.errors import ConfigError
from experiments.names import Metric
from experiments.stats import min_rounds, summary_stat


@dataclass(frozen=True)
class Rounds:
    concurrency: int
    runs: dict[str, tuple[LevelReport, ...]]   # server name -> its level in each round, in round order

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
        lines = ["round," + ",".join(f"{n}_{metric}_{stat},{n}_requests" for n in names)]
        for r in range(self.count):
            cells = []
            for n in names:
                values = self.runs[n][r].values(metric)
                cells += [f"{summary_stat(values, stat):.4f}" if len(values) else "", str(len(values))]
            lines.append(f"{r}," + ",".join(cells))
        return "\n".join(lines) + "\n"


def _by_prompt(level: LevelReport, metric: str) -> dict[int, float]:
    """Each prompt's first successful request in the run -> its metric."""
    if metric == Metric.ITL_MS:
        metric = Metric.TPOT_MS      # a request's mean inter-token latency is its TPOT
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


def measure(runs: dict[str, Callable[[], LevelReport]], rounds: int, concurrency: int,
            on_round=lambda r: None) -> Rounds:
    """`rounds` rounds; each calls every contender's run once, round r starting with contender r mod n.

    runs[name]() measures one run of that contender and returns its level: a fresh build in a fresh process of
    its own (experiments/contender.py), so neither the rival nor anything it left behind runs beside it, and
    two builds of one recipe, which keep speeds of their own (up to +-7 % for an ONNX Runtime session's life
    here), are sampled run by run instead of one instance per side.
    """
    names = list(runs)
    levels: dict[str, list[LevelReport]] = {n: [] for n in names}
    for r in range(int(rounds)):
        on_round(r)
        start = r % len(names)
        for name in names[start:] + names[:start]:
            levels[name].append(runs[name]())
    return Rounds(concurrency, {n: tuple(found) for n, found in levels.items()})


def check_config(cfg_interleaved, confidence: float) -> None:
    """rounds: 0 (compare with the champion's recorded run) or enough for an exact interval at `confidence`.
    The settings' types and ranges are the settings table's (experiments/settings.py)."""
    rounds = cfg_interleaved.rounds
    fewest = min_rounds(confidence)
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0 or 0 < rounds < fewest:
        raise ConfigError(f"gate.interleaved.rounds={rounds!r} is not 0 or an integer >= {fewest}",
                          f"0 compares with the champion's recorded run; {fewest} or more re-measure it beside the "
                          f"challenger (the fewest whose signed-rank interval reaches {confidence:.0%}; 8-12 is "
                          f"a good default)")
