"""Known answers for the SLO and soak criteria (issue 42): how often each decides right, with intervals.

Each trial draws what a measurement would give from a population whose truth is known, then asks the criterion
as a sweep asks it, beside the rule it replaced (one point estimate; a fixed warm-up cut and a slope whose
projection alone decides). Latencies: lognormal requests with a set true P95 (a heavier tail too), as many as a
demo sweep's pooled rounds at c=8 (200) or its recorded c=1 level (40). Memory: window medians of RSS every
10 s over the production soak (4 min warm-up, 30 min measured, a day's horizon, 64 MB budget), 1 MB of noise,
an allocator that settles over minutes, or a leak of the budget's size; and the quick profile's 3-second soak.

    make bench-slo [ARGS="--n 200 --seed 0"]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table
from scipy import stats

from experiments.benchmarks.gate_quality import Rate
from experiments.core.reports import BenchmarkReport, LevelReport
from experiments.core.request import Prompt, RequestRecord
from experiments.core.slo import SLO
from experiments.judge import slo_verdict
from experiments.judge.leak import decided, leak_check

BOUND = SLO.parse("p95_e2e_ms<=100")
PRODUCTION = {"warmup_s": 240, "duration_s": 1800, "window_s": 10, "horizon_h": 24.0, "budget_mb": 64.0}
QUICK = {"warmup_s": 1.5, "duration_s": 3.0, "window_s": 0.5, "horizon_h": 0.02, "budget_mb": 64.0}


def report(latencies_ms) -> BenchmarkReport:
    recs = []
    for i, ms in enumerate(latencies_ms):
        r = RequestRecord(Prompt(i, (1, 2, 3), 2), arrival=0.0, engine_start=0.0)
        r.token_times = [ms / 2e3, ms / 1e3]
        recs.append(r)
    return BenchmarkReport((LevelReport(8, 1.0, tuple(recs), {}, 0.0, 0.0, True),), (BOUND,))


def latencies(true_p95: float, n: int, rng, sigma: float) -> np.ndarray:
    return rng.lognormal(np.log(true_p95) - stats.norm.ppf(0.95) * sigma, sigma, n)


@dataclass(frozen=True)
class SloScenario:
    label: str
    champion_p95: float       # as a share of the bound
    challenger_p95: float
    n: int
    sigma: float
    want_lost: bool

    def trial(self, rng) -> tuple[bool, bool]:
        """(the criterion calls it lost, the point-estimate rule would have)."""
        a = report(latencies(100 * self.champion_p95, self.n, rng, self.sigma))
        b = report(latencies(100 * self.challenger_p95, self.n, rng, self.sigma))
        old = BOUND.met_by(a.levels[0]) and not BOUND.met_by(b.levels[0])
        return not slo_verdict.criterion(a, b, 0.95).passed, old


SLO_SCENARIOS = (
    SloScenario("A/A, true P95 2 % under the bound", 0.98, 0.98, 200, 0.3, False),
    SloScenario("A/A, true P95 at the bound", 1.00, 1.00, 200, 0.3, False),
    SloScenario("A/A, 2 % under, heavier tail", 0.98, 0.98, 200, 0.6, False),
    SloScenario("champion 10 % under, challenger 20 % over", 0.90, 1.20, 200, 0.3, True),
    SloScenario("the same, heavier tail", 0.90, 1.20, 200, 0.6, True),
    SloScenario("the same, heavier tail, 600 requests (rounds added while undecided)", 0.90, 1.20, 600, 0.6, True),
    SloScenario("the same, 40 requests a side (a recorded c=1 level)", 0.90, 1.20, 40, 0.3, True),
)


@dataclass(frozen=True)
class SoakScenario:
    label: str
    soak: dict
    settle_mb: float          # an allocator's growth that levels off, with time constant settle_s
    settle_s: float
    leak_budgets: float       # a persisting slope, in budgets per horizon
    noise_mb: float
    want: tuple[str, ...]     # the right answers: clean, leak, not decided

    def series(self, rng) -> tuple[np.ndarray, np.ndarray, int]:
        s = self.soak
        t = np.arange(0, s["warmup_s"] + s["duration_s"], s["window_s"]) + s["window_s"] / 2
        slope = self.leak_budgets * s["budget_mb"] / (s["horizon_h"] * 3600)
        y = 500 + self.settle_mb * (1 - np.exp(-t / self.settle_s)) + slope * t + rng.normal(0, self.noise_mb, t.size)
        return t, y, int(np.ceil(s["warmup_s"] / s["window_s"] - 1e-9))

    def trial(self, rng) -> tuple[str, str]:
        """(the criterion's answer, the old rule's): clean | leak | not decided."""
        t, y, warm = self.series(rng)
        s = self.soak
        crit = leak_check("leak_rss", t[warm:], y[warm:], s["horizon_h"], s["budget_mb"], 0.95)
        new = "leak" if not crit.passed else "clean" if decided(crit) else "not decided"
        fit = stats.theilslopes(y[warm:], t[warm:], alpha=0.95)
        old = "leak" if fit.low_slope > 0 and fit.slope * 3600 * s["horizon_h"] > s["budget_mb"] else "clean"
        return new, old


CLEAN, LEAK, NOT_FAILED = ("clean",), ("leak",), ("clean", "not decided")
SOAK_SCENARIOS = (
    SoakScenario("flat, no leak", PRODUCTION, 0, 1, 0, 1.0, CLEAN),
    SoakScenario("allocator warm-up (+300 MB, time constant 30 s), no leak", PRODUCTION, 300, 30, 0, 1.0, CLEAN),
    SoakScenario("the same, time constant 60 s (5 MB to come after the warm-up)", PRODUCTION, 300, 60, 0, 1.0,
                 CLEAN),
    SoakScenario("the same, 120 s (40 MB to come): beyond what 30 min tell", PRODUCTION, 300, 120, 0, 1.0, CLEAN),
    SoakScenario("a leak of the budget's size per horizon", PRODUCTION, 0, 1, 1.0, 1.0, LEAK),
    SoakScenario("the same leak after an allocator warm-up (60 s)", PRODUCTION, 300, 60, 1.0, 1.0, LEAK),
    SoakScenario("quick profile's 6 windows, an allocator settling over seconds: not failed", QUICK, 60, 1.5, 0,
                 0.5, NOT_FAILED),
    SoakScenario("quick profile's 6 windows, a leak 10x its budget: not passed clean", QUICK, 0, 1, 10.0, 0.5,
                 ("leak", "not decided")),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="trials per scenario (>= 59: a 95 %% bound can reach 95 %%)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng, console = np.random.default_rng(args.seed), Console(width=200)
    slo = Table("SLO scenario (p95 <= bound, 95 % intervals)", "n", "right", "95 % CI", "goal", "met",
                "called lost", "old rule: called lost", title="SLO criterion: known answers")
    for sc in SLO_SCENARIOS:
        calls = [sc.trial(rng) for _ in range(args.n)]
        lost, old = sum(c for c, _ in calls), sum(o for _, o in calls)
        right = Rate(lost if sc.want_lost else args.n - lost, args.n)
        slo.add_row(*right.row(sc.label, "")[:6], f"{lost}/{args.n}", f"{old}/{args.n}")
    console.print(slo)
    soak = Table("soak scenario", "n", "right", "95 % CI", "goal", "met", "clean / leak / not decided",
                 "old rule: clean / leak", title="leak check: known answers")
    for sc in SOAK_SCENARIOS:
        calls = [sc.trial(rng) for _ in range(args.n)]
        count = lambda which, at=0: sum(c[at] == which for c in calls)   # noqa: E731
        right = Rate(sum(count(w) for w in sc.want), args.n)
        soak.add_row(*right.row(sc.label, "")[:6], f"{count('clean')} / {count('leak')} / {count('not decided')}",
                     f"{count('clean', 1)} / {count('leak', 1)}")
    console.print(soak)
    console.print(f"settings: {OmegaConf.create({'production': PRODUCTION, 'quick': QUICK})}; seed {args.seed}")


if __name__ == "__main__":
    main()
