"""`make bench-gate`: does the gate decide right on real measurements of the built-in model? Rates in one run.

The gate from conf/ (the thresholds the ladder uses) judges real runs:
(a) A/A: the same configuration measured twice (two engines built from one recipe, two independent load runs)
    -> share judged "no significant change": not accepted, and the ratio CI claims no slowdown (goal >= 95 %);
(b) an injected 10 % slowdown (each decode step busy-waits 10 % of its own measured compute)
    -> share rejected with the ratio CI above 1 (goal >= 95 %);
(c) an injected accuracy drop (Gaussian noise on the decoder's weights, scale calibrated to cost ~2 points of
    the gate's metric) -> share the accuracy criterion rejects, over N noise seeds (goal >= 95 %).
"""
from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")   # tqdm reads it on import (lm-eval's, below): a bar per evaluation

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import torch
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table
from scipy import stats

from experiments.accuracy import evaluate
from experiments.benchmark import Workload, run_benchmark
from experiments.benchmarks.common import compose_default
from experiments.console import quiet_libraries
from experiments.gate import Gate, check_config
from experiments.serving import build_engine
from experiments.serving.engine import Engine
from experiments.targets import resolve
from optimizers.base import Candidate
from optimizers.baseline import EagerBaseline
from optimizers.onnxruntime_engine import OnnxRuntimeSwap

GOAL = 0.95
SLOWDOWN = 0.10
TARGET_DROP = 0.02                        # points of the gate's accuracy metric
CALIBRATION_SIGMAS = (0.5, 1.0, 1.5, 2.0)  # noise sd in units of each weight matrix's own sd
CALIBRATION_SEEDS = (10_001, 10_002)      # apart from the measured seeds 0..N-1
QUIET = 0.05                              # other processes' share of the CPUs in a quiet round


class SlowedEngine(Engine):
    """Test-only: every step takes `extra` x its own measured compute longer.

    Busy-wait, not sleep: a decode step of the tiny model in ONNX Runtime takes ~0.3 ms here, so the delay is
    ~30 us, and time.sleep(20e-6) takes ~77 us (timer slack and wake-up): sleeping would inject several times
    the intended slowdown. The spin runs on the server thread between steps, when the sequential server has
    no engine work in flight, so it takes no core away from the engine itself.
    """

    name = "slowed"

    def __init__(self, inner: Engine, extra: float):
        self.inner, self.extra = inner, extra

    def generate(self, prompt_ids, max_new_tokens):
        for token, compute in self.inner.generate(prompt_ids, max_new_tokens):
            delay = self.extra * compute
            until = time.perf_counter() + delay
            while time.perf_counter() < until:
                pass
            yield token, compute + delay

    def lm_eval_model(self, batch_size):
        return self.inner.lm_eval_model(batch_size)

    def artefact_paths(self):
        return self.inner.artefact_paths()

    def close(self):
        self.inner.close()


class DecoderNoise:
    """Test-only: Gaussian noise on the decoder layers' weight matrices (not the embedding, nor the tied head)."""

    def __init__(self, model):
        self.params = [p for p in model.model.layers.parameters() if p.dim() == 2]
        self.clean = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def apply(self, sigma: float, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for p, clean in zip(self.params, self.clean):
            p.copy_(clean + sigma * clean.std() * torch.randn(clean.shape, generator=gen))

    @torch.no_grad()
    def restore(self) -> None:
        for p, clean in zip(self.params, self.clean):
            p.copy_(clean)


@dataclass(frozen=True)
class Rate:
    hits: int
    n: int

    @property
    def share(self) -> float:
        return self.hits / self.n

    def interval(self) -> tuple[float, float]:
        ci = stats.binomtest(self.hits, self.n).proportion_ci(0.95, method="exact")
        return ci.low, ci.high

    def row(self, label: str, detail: str) -> tuple[str, ...]:
        lo, hi = self.interval()
        return (label, str(self.n), f"{self.share:.0%}", f"[{lo:.0%}, {hi:.0%}]", f">= {GOAL:.0%}",
                "yes" if self.share >= GOAL else "NO", detail)


def setup(console):
    cfg = compose_default()
    check_config(cfg.gate)
    target, texts, shipped_tasks = resolve(cfg.target, Path(cfg.cache_dir), Path(cfg.data_dir), console.print)
    from transformers import AutoTokenizer

    wl = cfg.target.workload
    workload = Workload.from_texts(texts, AutoTokenizer.from_pretrained(target.model_dir), wl.input_tokens,
                                   wl.output_tokens, wl.prompts, max(8, cfg.benchmark.warmup_requests), cfg.seed,
                                   wl.get("shared_prefix_tokens", 0))
    include_path = Path(cfg.accuracy.include_path) if cfg.accuracy.include_path else shipped_tasks
    return cfg, EagerBaseline().apply(Candidate(target)), workload, include_path


def performance(cfg, gate: Gate, base: Candidate, workload: Workload, n: int, seconds: float, console):
    """N rounds of three runs (champion, the same again, slowed) in a seeded random order, so drift hits all."""
    ort = OnnxRuntimeSwap().apply(base)
    artefacts = Path(cfg.cache_dir) / "artefacts"
    load = OmegaConf.merge(cfg.benchmark, {"concurrency": [4], "min_requests": 100, "min_duration_s": seconds,
                                           "max_duration_s": 10 * seconds, "slos": [], "sla_search": False})
    order = random.Random(cfg.seed)
    same, slowed, others = [], [], []
    for i in range(n):
        runs = {}
        with OtherLoad() as load_meter:
            for kind in order.sample(["champion", "same", "slowed"], 3):
                engine = build_engine(ort, int(cfg.threads), artefacts)
                if kind == "slowed":
                    engine = SlowedEngine(engine, SLOWDOWN)
                try:
                    runs[kind] = run_benchmark(engine, workload, load, cfg.gate.confidence)
                finally:
                    engine.close()
        same.append(gate.performance(runs["champion"], runs["same"]))
        slowed.append(gate.performance(runs["champion"], runs["slowed"]))
        others.append(load_meter.share)
        console.print(f"  round {i + 1}/{n}: A/A {_ratio(same[-1])}   slowed {_ratio(slowed[-1])}   "
                      f"other processes {others[-1]:.0%} of the CPUs", highlight=False)
    requests = len(runs["champion"].levels[0].records)
    return same, slowed, others, requests


class OtherLoad:
    """Share of the machine's CPU time that other processes used while the block ran: the gate's intervals
    cover request-to-request variation within a run, not a neighbour that slows one run and not the other."""

    def __enter__(self):
        self._start = (_busy(psutil.cpu_times()), _own(), time.perf_counter())
        return self

    def __exit__(self, *exc):
        busy, own, started = self._start
        wall = (time.perf_counter() - started) * psutil.cpu_count()
        self.share = max(0.0, (_busy(psutil.cpu_times()) - busy) - (_own() - own)) / wall


def _busy(t) -> float:
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def accuracy(cfg, gate: Gate, base: Candidate, include_path: Path, n: int, sigmas, console):
    engine = build_engine(base, int(cfg.threads), Path(cfg.cache_dir) / "artefacts")
    noise = DecoderNoise(engine.model)

    def measure():
        return evaluate(engine.lm_eval_model(int(cfg.accuracy.batch_size)), list(cfg.accuracy.tasks),
                        cfg.gate.accuracy.metric, include_path, cfg.accuracy.limit, cfg.seed)[0]

    try:
        champion = measure()
        console.print(f"  champion {champion.task} {champion.metric} = {champion.value:.4f} "
                      f"(n = {len(champion.per_doc)} documents)", highlight=False)
        calibration = []
        for sigma in sigmas:
            drops = []
            for seed in CALIBRATION_SEEDS:
                noise.apply(sigma, seed)
                drops.append(champion.value - measure().value)
            calibration.append((sigma, float(np.mean(drops))))
            console.print(f"  calibration: sigma {sigma:.3g} -> drop {calibration[-1][1]:+.4f} "
                          f"(seeds {', '.join(f'{d:+.4f}' for d in drops)})", highlight=False)
        sigma, how = calibrate(calibration)
        console.print(f"  calibrated: sigma {sigma:.3f} for a {TARGET_DROP:.2f} drop ({how})", highlight=False)
        criteria = []
        for seed in range(n):
            noise.apply(sigma, seed)
            criteria.append(gate.accuracy(champion, measure()))
            c = criteria[-1].numbers
            console.print(f"  seed {seed}: drop {c['drop']:+.4f} se {c['drop_se']:.4f} upper {c['drop_upper']:+.4f}"
                          f" -> {'pass' if criteria[-1].passed else 'REJECT'}", highlight=False)
        return sigma, criteria
    finally:
        noise.restore()
        engine.close()


def calibrate(points) -> tuple[float, str]:
    """The noise scale whose mean drop is TARGET_DROP, interpolated in log(sigma) on the grid's mean drops,
    made non-decreasing first (more noise cannot help on average; a dip is seed noise)."""
    sigmas, drops = np.array(points).T
    drops = np.maximum.accumulate(drops)
    if not drops[0] <= TARGET_DROP <= drops[-1]:
        raise RuntimeError(f"the calibration grid {sigmas.tolist()} does not bracket a {TARGET_DROP} drop "
                           f"(mean drops {', '.join(f'{d:+.4f}' for d in drops)}): widen it")
    sigma = float(np.exp(np.interp(TARGET_DROP, drops, np.log(sigmas))))
    return sigma, "interpolated in log(sigma) on the non-decreasing grid means"


def summary(same, slowed, others, acc, sigma: float, requests: int, confidence: float) -> Table:
    n = len(same)
    aa = Rate(sum(_no_change(c) for c in same), n)
    contains = Rate(sum(_num(c, "ratio_ci_low") <= 1 <= _num(c, "ratio_ci_high") for c in same), n)
    caught = Rate(sum(_caught(c) for c in slowed), n)
    rejected = Rate(sum(not c.passed for c in acc), len(acc))
    quiet = [i for i, share in enumerate(others) if share < QUIET]
    on_quiet = (f"; quiet rounds (others < {QUIET:.0%} CPU): "
                f"{sum(_no_change(same[i]) for i in quiet)}/{len(quiet)}")
    drops = np.array([c.numbers["drop"] for c in acc])
    table = Table(title=f"gate decision quality (exact 95 % binomial intervals on each rate; "
                        f"~{requests} requests per run)")
    for col in ("check", "N", "rate", "95 % CI", "goal", "met", "detail"):
        table.add_column(col)
    table.add_row(*aa.row("A/A: no significant change", "not accepted and CI low <= 1" + on_quiet))
    lo, hi = contains.interval()
    table.add_row("A/A: ratio CI contains 1", str(n), f"{contains.share:.0%}", f"[{lo:.0%}, {hi:.0%}]",
                  f"~{confidence:.0%}", "", f"median ratio {np.median([_num(c, 'ratio') for c in same]):.3f}")
    table.add_row(*caught.row(f"+{SLOWDOWN:.0%} per-step slowdown caught",
                              f"rejected, CI low > 1; median ratio {np.median([_num(c, 'ratio') for c in slowed]):.3f}"
                              f"; in quiet rounds: {sum(_caught(slowed[i]) for i in quiet)}/{len(quiet)}"))
    table.add_row(*rejected.row(f"~{TARGET_DROP * 100:.0f}-point accuracy drop rejected",
                                f"sigma {sigma:.3f}: drop mean {drops.mean():+.4f}, range [{drops.min():+.4f}, "
                                f"{drops.max():+.4f}], {int((drops <= 0).sum())} seeds measured no drop"))
    return table


def _no_change(c) -> bool:
    return not c.passed and _num(c, "ratio_ci_low") <= 1


def _caught(c) -> bool:
    return not c.passed and _num(c, "ratio_ci_low") > 1


def _num(criterion, key: str) -> float:
    """A criterion without numbers (too few requests to compare) counts as a miss in every rate."""
    return criterion.numbers.get(key, np.nan)


def _ratio(c) -> str:
    x = c.numbers
    return f"{x['ratio']:.3f} [{x['ratio_ci_low']:.3f}, {x['ratio_ci_high']:.3f}]" if x else c.detail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, help="A/A pairs, slowed pairs and noise seeds (default 20, quick 5)")
    parser.add_argument("--seconds", type=float, help="each benchmark run (default 3 s, quick 1.5 s)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer, shorter runs, 2-point calibration")
    args = parser.parse_args()
    n = args.n if args.n is not None else (5 if args.quick else 20)
    seconds = args.seconds if args.seconds is not None else (1.5 if args.quick else 3.0)
    sigmas = CALIBRATION_SIGMAS[::3] if args.quick else CALIBRATION_SIGMAS
    if n < 1 or seconds <= 0:
        parser.error("--n must be >= 1 and --seconds > 0")
    quiet_libraries()
    console = Console(width=150)
    started = time.perf_counter()
    cfg, base, workload, include_path = setup(console)
    gate, g = Gate(cfg.gate, cfg.seed), cfg.gate
    console.print(f"gate from conf/: {g.objective.metric} {g.objective.stat} @c={g.objective.concurrency}, "
                  f"min_gain {g.min_gain}, confidence {g.confidence}, {g.bootstrap_resamples} bootstrap resamples",
                  highlight=False)
    console.print(f"  accuracy: {g.accuracy.metric}, max_drop_abs {g.accuracy.max_drop_abs}, "
                  f"max_drop_rel {g.accuracy.get('max_drop_rel')}", highlight=False)
    console.print(f"[bold]performance[/bold]: onnxruntime fp32 engine, closed loop c=4, {seconds:g} s per run, "
                  f"{n} rounds of (champion, same, +{SLOWDOWN:.0%} slowed)")
    same, slowed, others, requests = performance(cfg, gate, base, workload, n, seconds, console)
    console.print(f"[bold]accuracy[/bold]: torch fp32 engine, lm-eval {', '.join(cfg.accuracy.tasks)}, "
                  f"{n} noise seeds")
    sigma, acc = accuracy(cfg, gate, base, include_path, n, sigmas, console)

    console.print(summary(same, slowed, others, acc, sigma, requests, g.confidence))
    console.print(f"elapsed {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
