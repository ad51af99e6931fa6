"""`make bench-gate`: does the gate decide right on real measurements of the built-in model? Rates in one run.

The gate from conf/ (the thresholds and the interleaved rounds the ladder uses) judges real runs:
(a) A/A: the same configuration measured twice (two engines built from one recipe, built and measured in
    rounds as the ladder does) -> share judged "no significant change": not accepted, and the ratio CI claims no
    slowdown (goal >= 95 %);
(b) an injected 10 % slowdown (each request sleeps 10 % of its own measured compute before its last token)
    -> share rejected with the ratio CI above 1 (goal >= 95 %);
(c) an injected accuracy drop (Gaussian noise on the decoder's weights, scale calibrated to cost ~2 points of
    the gate's metric) -> share the gate rejects over N noise seeds (goal >= 95 %): its accuracy criterion
    (lm-eval, paired z-test) and its fidelity criterion (KL / top-1 against the clean model), each shown.
(d) a disturbing contender: the champion's own engine plus threads that burn the cores whenever it is idle (a
    rival measured while it idles, in its process or beside it, is slowed and it looks faster) -> share not
    accepted (goal >= 95 %): the rounds measure each side with nothing of the other running;
(e) a harmless change (the same noise at a quarter of (c)'s scale: answers flip per document, the mean does not
    drop — what a good int8 does) -> share the gate accepts on both criteria (goal >= 90 %);
(f) a real 10 % gain: the champion judged as a challenger of the slowed contender (b) -> share accepted
    (goal >= 95 %).
With sequential rounds (gate.interleaved.max_rounds), a trial's rounds go on until each comparison is decided,
and each is judged on the rounds its own looks would have taken (Gate.looked): the rounds it used are shown.
For contrast, the same runs judged the old way: one run each, a bootstrap over their requests.
"""
from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")   # tqdm reads it on import (lm-eval's, below): a bar per evaluation

import argparse
import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import psutil
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table
from scipy import stats
from transformers import AutoTokenizer

from experiments.benchmarks.common import compose_default
from experiments.benchmarks.gate_accuracy import (
    CALIBRATION_SIGMAS,
    HARMLESS_GOAL,
    HARMLESS_SCALE,
    TARGET_DROP,
    accuracy,
)
from experiments.benchmarks.gate_contenders import disturbing_build, slowed_build
from experiments.climb import contender
from experiments.core.interrupts import Terminated, exit_on_sigterm
from experiments.core.recipe import Candidate
from experiments.core.reports import BenchmarkReport
from experiments.judge.fidelity import fixed_sequences
from experiments.judge.gate import Criterion, Gate, check_config
from experiments.measure import interleaved, isolation
from experiments.record.console import quiet_libraries
from experiments.serving import build_engine
from experiments.targets.resolve import resolve
from experiments.targets.workload import Workload
from optimizers.baseline import EagerBaseline
from optimizers.onnxruntime_engine import OnnxRuntimeSwap

GOAL = 0.95
SLOWDOWN = 0.10
QUIET = 0.05                              # other processes' share of the CPUs in a quiet trial
CONCURRENCY = 4


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

    def row(self, label: str, detail: str, goal: float = GOAL) -> tuple[str, ...]:
        lo, hi = self.interval()
        return (label, str(self.n), f"{self.share:.0%}", f"[{lo:.0%}, {hi:.0%}]", f">= {goal:.0%}",
                "yes" if self.share >= goal else "NO", detail)


def setup(console, overrides=()):
    cfg = compose_default(overrides)
    check_config(cfg.gate)
    target, texts, shipped_tasks = resolve(cfg.target, Path(cfg.cache_dir), Path(cfg.data_dir), console.print)
    tokenizer = AutoTokenizer.from_pretrained(target.model_dir)
    wl = cfg.target.workload
    workload = Workload.from_texts(texts, tokenizer, wl.input_tokens, wl.output_tokens, wl.prompts,
                                   max(8, cfg.benchmark.warmup_requests), cfg.seed, wl.get("shared_prefix_tokens", 0))
    fid = cfg.gate.fidelity
    windows = fixed_sequences(tokenizer, texts, int(fid.sequences), int(fid.length), cfg.seed)
    include_path = Path(cfg.accuracy.include_path) if cfg.accuracy.include_path else shipped_tasks
    return cfg, EagerBaseline().apply(Candidate(target)), workload, include_path, windows


def performance(cfg, gate: Gate, base: Candidate, workload: Workload, n: int, concurrency: int, console):
    """N trials of the gate's interleaved rounds over four contenders built from one recipe (champion, the
    same again, slowed, disturbing), built and measured as the ladder does (conf/gate's fresh_build_per_run: by default
    each built once per trial in a process of its own, stopped while another runs; the order drawn per trial).
    Also judged the old way: round 0's runs alone, a bootstrap over their requests."""
    ort = OnnxRuntimeSwap().apply(base)
    artefacts = Path(cfg.cache_dir) / "artefacts"
    load = OmegaConf.merge(cfg.benchmark, {"slos": [], "sla_search": False, "max_duration_s": 60.0})
    load = interleaved.load_config(load, cfg.gate.interleaved, concurrency)
    trials = []
    threads = int(cfg.threads)
    apart = contender.Apart(isolation.Limits(3600, 2**34, 0.2), Path(cfg.data_dir) / "logs" / "bench-gate", "run")
    builds = {"champion": partial(build_engine, ort, threads, artefacts),
              "same": partial(build_engine, ort, threads, artefacts),
              "slowed": partial(slowed_build, ort, threads, artefacts, SLOWDOWN),
              "disturbing": partial(disturbing_build, ort, threads, artefacts)}
    fresh = bool(cfg.gate.interleaved.get("fresh_build_per_run", False))
    looks = gate.round_looks()
    obj = cfg.gate.objective

    def undecided(r) -> set[str]:
        """The contenders of the comparisons no look so far has decided (a decided one stops being measured)."""
        return {name for pair in PAIRS.values() if gate.decided_at(r.ratios(*pair, obj.metric, obj.stat)) is None
                for name in pair}

    ratios_file = apart.logs / f"ratios-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    ratios_file.parent.mkdir(parents=True, exist_ok=True)
    console.print(f"  each round's ratios: {ratios_file}")
    for i in range(n):
        with contender.round_runs(builds, fresh, workload, load, concurrency, cfg.gate.confidence, apart,
                                  i) as runs, OtherLoad() as load_meter:
            rounds = interleaved.measure(runs, looks[-1], concurrency, seed=(cfg.seed, i), looks=looks[:-1],
                                         decided=lambda r: not undecided(r), needed=undecided)
        single = {k: BenchmarkReport((levels[0],)) for k, levels in rounds.runs.items()}
        judged = {name: gate.looked(rounds, *pair) for name, pair in PAIRS.items()}
        with ratios_file.open("a") as f:   # every round's ratio: another stopping rule can be judged on them later
            f.write(json.dumps({"trial": i, "others": load_meter.share, "stat": obj.stat, "ratios": {
                name: [float(r) for r in rounds.ratios(*pair, obj.metric, obj.stat)] for name, pair in PAIRS.items()},
                "p50_ratios": {name: [float(r) for r in rounds.ratios(*pair, obj.metric, "p50")]
                               for name, pair in PAIRS.items()}}) + "\n")
        trials.append(Trial(same=judged["same"][0], slowed=judged["slowed"][0], disturbing=judged["disturbing"][0],
                            gain=judged["gain"][0], used={name: used for name, (_, used) in judged.items()},
                            same_single=gate.performance(single["champion"], single["same"]),
                            slowed_single=gate.performance(single["champion"], single["slowed"]),
                            disturbing_single=gate.performance(single["champion"], single["disturbing"]),
                            others=load_meter.share, requests=len(rounds.runs["champion"][0].records)))
        t = trials[-1]
        console.print(f"  trial {i + 1}/{n}: A/A {_ratio(t.same)}   slowed {_ratio(t.slowed)}   disturbing "
                      f"{_ratio(t.disturbing)}{' ACCEPTED' if t.disturbing.passed else ''}   gain {_ratio(t.gain)}"
                      f"{' accepted' if t.gain.passed else ''}   rounds {t.used}   (one run each: A/A "
                      f"{_ratio(t.same_single)}, slowed {_ratio(t.slowed_single)})   "
                      f"other processes {t.others:.0%} of the CPUs", highlight=False)
    return trials


# each judged comparison: (challenger, champion) among the trial's contenders
PAIRS = {"same": ("same", "champion"), "slowed": ("slowed", "champion"), "disturbing": ("disturbing", "champion"),
         "gain": ("champion", "slowed")}


@dataclass(frozen=True)
class Trial:
    same: Criterion
    slowed: Criterion
    disturbing: Criterion
    gain: Criterion           # the champion against the slowed contender: a real 10 % gain
    used: dict                # rounds each comparison took (PAIRS' names)
    same_single: Criterion
    slowed_single: Criterion
    disturbing_single: Criterion
    others: float
    requests: int


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
    """CPU seconds of this process and its descendants (the fork server and the contenders it forked, alive
    through a trial; a descendant that ends within it would count as another process)."""
    me, total = psutil.Process(), 0.0
    for proc in (me, *me.children(recursive=True)):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def summary(trials: list[Trial], verdicts, harmless, sigma: float, cfg_gate) -> Table:
    rounds = cfg_gate.interleaved
    per_run = f" (~{int(np.median([t.requests for t in trials]))} requests per run)" if trials else ""
    upto = f" (up to {rounds.max_rounds}, while undecided)" if rounds.get("max_rounds") else ""
    table = Table(title=f"gate decision quality: {rounds.rounds}{upto} interleaved rounds of {rounds.seconds:g} s per "
                        f"comparison{per_run}; exact 95 % binomial intervals on each rate")
    for col in ("check", "N", "rate", "95 % CI", "goal", "met", "detail"):
        table.add_column(col)
    if trials:
        _performance_rows(table, trials)
    if verdicts or harmless:
        _accuracy_rows(table, verdicts, harmless, sigma)
    return table


def _performance_rows(table: Table, trials: list[Trial]) -> None:
    n = len(trials)
    quiet = [t for t in trials if t.others < QUIET]
    aa = Rate(sum(_no_change(t.same) for t in trials), n)
    table.add_row(*aa.row("A/A: no significant change", f"not accepted and CI low <= 1; median ratio "
                          f"{np.median([_num(t.same, 'ratio') for t in trials]):.3f}; quiet trials (others < "
                          f"{QUIET:.0%} CPU): {sum(_no_change(t.same) for t in quiet)}/{len(quiet)}"))
    caught = Rate(sum(_caught(t.slowed) for t in trials), n)
    table.add_row(*caught.row(f"+{SLOWDOWN:.0%} per-step slowdown caught",
                              f"rejected, CI low > 1; median ratio "
                              f"{np.median([_num(t.slowed, 'ratio') for t in trials]):.3f}; quiet trials: "
                              f"{sum(_caught(t.slowed) for t in quiet)}/{len(quiet)}"))
    gained = Rate(sum(t.gain.passed for t in trials), n)
    table.add_row(*gained.row(f"real {SLOWDOWN:.0%} gain accepted",
                              f"the champion against the slowed contender; median ratio "
                              f"{np.median([_num(t.gain, 'ratio') for t in trials]):.3f}"))
    kept_out = Rate(sum(not t.disturbing.passed for t in trials), n)
    table.add_row(*kept_out.row("disturbing contender not accepted",
                                f"its threads burn the cores while it idles; median ratio "
                                f"{np.median([_num(t.disturbing, 'ratio') for t in trials]):.3f}; one run each, not "
                                f"accepted: {sum(not t.disturbing_single.passed for t in trials)}/{n}"))
    table.add_row("rounds per comparison (median, max)", str(n), "", "", "", "",
                  "; ".join(f"{name} {np.median([t.used[name] for t in trials]):g}, {max(t.used[name] for t in trials)}"
                            for name in PAIRS) + f"; accepted of A/A, slowed, disturbing: "
                  f"{sum(t.same.passed + t.slowed.passed + t.disturbing.passed for t in trials)} of {3 * n}")
    single_aa = Rate(sum(_no_change(t.same_single) for t in trials), n)
    single_caught = Rate(sum(_caught(t.slowed_single) for t in trials), n)
    for label, rate in (("old way, one run each: A/A no change", single_aa),
                        ("old way, one run each: slowdown caught", single_caught)):
        lo, hi = rate.interval()
        table.add_row(label, str(rate.n), f"{rate.share:.0%}", f"[{lo:.0%}, {hi:.0%}]", "(contrast)", "",
                      "round 0's runs alone, bootstrap over their requests")


def _accuracy_rows(table: Table, verdicts, harmless, sigma: float) -> None:
    if verdicts:
        _drop_rows(table, verdicts, sigma)
    if harmless:
        _harmless_row(table, harmless, sigma)


def _drop_rows(table: Table, verdicts, sigma: float) -> None:
    either = Rate(sum(not (a.passed and f.passed) for a, f, _ in verdicts), len(verdicts))
    drops = np.array([a.numbers["drop"] for a, _, _ in verdicts])
    table.add_row(*either.row(f"~{TARGET_DROP * 100:.0f}-point accuracy drop rejected by the gate",
                              f"sigma {sigma:.3f}: drop mean {drops.mean():+.4f}, range [{drops.min():+.4f}, "
                              f"{drops.max():+.4f}]; either criterion below fails it"))
    open_ = sum(a.undecided for a, _, _ in verdicts)
    by_look = [sum(not a.passed and not a.undecided and a.numbers.get("look") == look for a, _, _ in verdicts)
               for look in (1.0, 2.0)]
    looks = f"rejected at either look ({by_look[0]} at the first, {by_look[1]} at the last)"
    for label, picked, detail in (
            ("  of which: accuracy criterion (lm-eval, paired z)", 0,
             f"{looks}; {open_} more undecided at the first look, not scored further because fidelity had failed "
             f"(as a rung does)" if open_ else looks),
            ("  of which: fidelity criterion (KL, top-1)", 1, "")):
        rate = Rate(sum(not v[picked].passed and not v[picked].undecided for v in verdicts), len(verdicts))
        lo, hi = rate.interval()
        table.add_row(label, str(rate.n), f"{rate.share:.0%}", f"[{lo:.0%}, {hi:.0%}]", "", "", detail)


def _harmless_row(table: Table, harmless, sigma: float) -> None:
    passed = Rate(sum(a.passed and f.passed for a, f, _ in harmless), len(harmless))
    kept = np.array([a.numbers["drop"] for a, _, _ in harmless])
    flips = [k for _, _, k in harmless]
    kl = [f.numbers.get("kl_mean", np.nan) for _, f, _ in harmless]
    table.add_row(*passed.row("harmless change accepted (both criteria)",
                              f"sigma {sigma * HARMLESS_SCALE:.3f}: {min(flips)}-{max(flips)} documents changed, drop "
                              f"mean {kept.mean():+.4f}, range [{kept.min():+.4f}, {kept.max():+.4f}]; KL "
                              f"{np.nanmin(kl):.2g}-{np.nanmax(kl):.2g}; accuracy alone "
                              f"{sum(a.passed for a, _, _ in harmless)}/{len(harmless)}, fidelity alone "
                              f"{sum(f.passed for _, f, _ in harmless)}/{len(harmless)}", HARMLESS_GOAL))


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
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, help="trials (A/A and slowed pairs) and noise seeds (default 20, quick 5)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 5 trials of 6 rounds of 0.2 s, 2-point calibration")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per comparison (default: conf/, the profile's)")
    parser.add_argument("--max-rounds", type=int, dest="max_rounds",
                        help="sequential rounds' last look (default: conf/, the profile's; 0: one look)")
    parser.add_argument("--seconds", type=float, help="each run in a round (default: conf/, the profile's)")
    parser.add_argument("--profile", default="demo",
                        help="the conf/profile whose gate settings judge (default demo, make sweep's; none: "
                             "conf/gate's own, 20 rounds of 1 s)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the accuracy scenarios' first noise seed (runs over other seeds add up)")
    parser.add_argument("--sigma", type=float,
                        help="the accuracy scenarios' noise scale, from an earlier run's calibration (skips it)")
    parser.add_argument("--accuracy-alone", action="store_true",
                        help="score the accuracy criterion's last look wherever its first is undecided, even where "
                             "fidelity failed (as for distillation, judged on accuracy alone): its own power")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/, as for a sweep (e.g. threads=1)")
    parser.add_argument("--part", choices=("all", "performance", "accuracy", "drop", "harmless"), default="all",
                        help="only the performance trials, only the accuracy seeds (drop and harmless), or only "
                             "one of the two accuracy scenarios: two processes can score them side by side")
    args = parser.parse_args()
    n = args.n if args.n is not None else (5 if args.quick else 20)
    sigmas = CALIBRATION_SIGMAS[::3] if args.quick else CALIBRATION_SIGMAS
    if n < 1:
        parser.error("--n must be >= 1")
    quiet_libraries()
    console = Console(width=170)
    started = time.perf_counter()
    profile = ["~profile"] if args.profile == "none" else [f"profile={args.profile}"]
    cfg, base, workload, include_path, windows = setup(console, [*profile, *args.overrides])
    if args.quick:
        cfg.gate.interleaved = OmegaConf.merge(cfg.gate.interleaved, {"rounds": 6, "seconds": 0.2, "max_rounds": None})
    for key in ("rounds", "seconds", "max_rounds"):
        if getattr(args, key) is not None:
            cfg.gate.interleaved[key] = getattr(args, key) or None
    check_config(cfg.gate)
    gate, g = Gate(cfg.gate, cfg.seed), cfg.gate
    console.print(f"gate from conf/ (profile {args.profile}): {g.objective.metric} {g.objective.stat}, min_gain "
                  f"{g.min_gain}, confidence {g.confidence}; interleaved {g.interleaved.rounds} rounds "
                  f"(up to {g.interleaved.get('max_rounds') or g.interleaved.rounds}) x "
                  f"{g.interleaved.seconds:g} s "
                  f"(>= {g.interleaved.min_requests} requests)", highlight=False)
    metric = g.accuracy.metric or "each task's first per-document metric"
    console.print(f"  accuracy: {metric}, max_drop_abs {g.accuracy.max_drop_abs}, max_drop_rel "
                  f"{g.accuracy.get('max_drop_rel')}; fidelity: max_kl {g.fidelity.max_kl}, min_top1 "
                  f"{g.fidelity.min_top1}", highlight=False)
    trials, verdicts, harmless, sigma = [], [], [], float("nan")
    if args.part in ("all", "performance"):
        console.print(f"[bold]performance[/bold]: onnxruntime fp32 engine, closed loop c={CONCURRENCY}, {n} trials "
                      f"of (champion, same, +{SLOWDOWN:.0%} slowed, disturbing) in a drawn, balanced order")
        trials = performance(cfg, gate, base, workload, n, CONCURRENCY, console)
    if args.part in ("all", "accuracy", "drop", "harmless"):
        scenarios = (args.part,) if args.part in ("drop", "harmless") else ("drop", "harmless")
        console.print(f"[bold]accuracy[/bold]: torch fp32 engine, lm-eval {', '.join(cfg.accuracy.tasks)} "
                      f"({cfg.accuracy.limit or 'all'} documents, "
                      f"{cfg.accuracy.get('first_look') or 'all'} at the first look) and {len(windows)} fidelity windows, "
                      f"{n} noise seeds: "
                      f"{' and '.join(scenarios)}")
        sigma, verdicts, harmless = accuracy(cfg, gate, base, include_path, windows, n, sigmas, console, scenarios,
                                             args.sigma, args.first_seed, args.accuracy_alone)

    console.print(summary(trials, verdicts, harmless, sigma, cfg.gate))
    console.print(f"elapsed {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    try:
        main()
    except Terminated:
        raise SystemExit(143) from None
