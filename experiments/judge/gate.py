"""Challenger vs champion: every criterion with its numbers, never a bare boolean."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np
from scipy import stats

from experiments.core.errors import ConfigError
from experiments.core.reports import BenchmarkReport
from experiments.core.settings import check_section
from experiments.core.stats import min_rounds, ratio_ci, rounds_ratio_ci, summary_stat
from experiments.judge import sequential
from experiments.judge.accuracy import AccuracyReport

TOLERANCES = ("max_drop_abs", "max_drop_rel")
# What a rung is for (its `aim`): speed, a gain of min_gain; or memory, a saving of memory.min_saving at no
# slowdown beyond memory.max_slowdown (a KV cache in fewer bits: more sequences fit, each step no faster).
AIMS = ("speed", "memory")
# lm-eval's per-document metric name, as in its samples; results keys add a filter (`acc,none`).
METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Criterion:
    name: str
    passed: bool
    detail: str
    numbers: dict[str, float] = field(default_factory=dict)
    undecided: bool = False     # not passed yet: a first look that more documents may decide, or no evidence

    @property
    def word(self) -> str:
        """As a run's tag and the review read it: pass, FAIL, or undecided."""
        return "pass" if self.passed else "undecided" if self.undecided else "FAIL"


@dataclass(frozen=True)
class Verdict:
    status: str                      # accepted | rejected | undecided | skipped | failed
    reason: str
    criteria: tuple[Criterion, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    @classmethod
    def from_criteria(cls, criteria: list[Criterion]) -> "Verdict":
        """Rejected where a criterion failed on evidence; undecided where every one that did not pass was left
        undecided (no evidence either way: the champion stays, and the challenger is not called worse)."""
        failed = [c for c in criteria if not c.passed]
        if failed:
            status = "undecided" if all(c.undecided for c in failed) else "rejected"
            return cls(status, "; ".join(c.detail for c in failed), tuple(criteria))
        return cls("accepted", "; ".join(c.detail for c in criteria), tuple(criteria))


class Gate:
    def __init__(self, cfg, seed: int = 0, aim: str = "speed"):
        if aim not in AIMS:
            raise ValueError(f"a rung's aim is one of {AIMS}, not {aim!r}")
        self.cfg = cfg
        self.seed = seed
        self.aim = aim
        self._bound_word = "allowed" if aim == "memory" else "needed"   # a ceiling on slowdown, or a gain

    def aimed_at(self, aim: str) -> "Gate":
        """This gate for a rung whose aim is `aim` (AIMS)."""
        return self if aim == self.aim else Gate(self.cfg, self.seed, aim)

    @property
    def speed_bound(self) -> float:
        """The speed ratio (challenger / champion) whose upper bound a challenger must stay below: a gain of
        min_gain, or, aiming at memory, no slowdown beyond memory.max_slowdown (non-inferiority)."""
        if self.aim == "memory":
            return 1 + float(self.cfg.memory.max_slowdown)
        return 1 - float(self.cfg.min_gain)

    def objective_concurrency(self, champion: BenchmarkReport) -> int:
        obj = self.cfg.objective
        return max(lv.concurrency for lv in champion.levels) if obj.concurrency == "max" else int(obj.concurrency)

    def performance(self, champion: BenchmarkReport, challenger: BenchmarkReport) -> Criterion:
        """Against the champion's recorded run: a bootstrap over the requests of the two runs."""
        obj = self.cfg.objective
        level = self.objective_concurrency(champion)
        a = challenger.level(level).values(obj.metric)
        b = champion.level(level).values(obj.metric)
        if len(a) < 2 or len(b) < 2:
            return Criterion("performance", False, f"too few successful requests at c={level} to compare "
                                                   f"({len(a)} vs {len(b)})")
        ratio, lo, hi = ratio_ci(a, b, obj.stat, self.cfg.confidence, self.cfg.bootstrap_resamples, self.seed)
        return self._judged(ratio, lo, hi, f"{obj.metric} {obj.stat} @c={level}", {})

    def without_rounds(self, champion: BenchmarkReport, challenger: BenchmarkReport) -> Criterion | None:
        """Rejected before any rounds, or None (rounds needed): a gain must show in the recorded runs too, so a
        challenger whose own run is not faster than the champion's at the objective (ratio >= 1) cannot be
        accepted, whatever rounds would show (consistency() applies the same rule to a gain they show). A rung
        aiming at memory seeks no gain: its rounds always run."""
        if self.aim == "memory":
            return None
        crit = self.performance(champion, challenger)
        if not crit.numbers.get("ratio", math.nan) >= 1:
            return None
        return replace(crit, passed=False, detail=f"decided without rounds, the recorded runs show no gain (an "
                                                  f"accepted gain must show there too): {crit.detail}")

    def interleaved(self, rounds, challenger: str = "challenger", champion: str = "champion") -> Criterion:
        """Against the champion re-measured beside the challenger: Hodges-Lehmann and its signed-rank interval
        over the per-round ratios."""
        obj = self.cfg.objective
        ratios = rounds.ratios(challenger, champion, obj.metric, obj.stat)
        return self.on_ratios(ratios, f"{obj.metric} {obj.stat} @c={rounds.concurrency}, {len(ratios)} "
                                      f"interleaved rounds")

    def on_ratios(self, ratios: np.ndarray, label: str = "ratio") -> Criterion:
        if len(ratios) < min_rounds(self.cfg.confidence) or not np.isfinite(ratios).all():
            return Criterion("performance", False, f"{label}: a round without successful requests, or too few "
                                                   f"rounds for a {self.cfg.confidence:.0%} interval "
                                                   f"({np.round(ratios, 3).tolist()})")
        ratio, lo, hi = rounds_ratio_ci(ratios, self.cfg.confidence)
        spread = {"rounds": float(len(ratios)), "round_ratio_min": float(ratios.min()),
                  "round_ratio_max": float(ratios.max())}
        at_look = self.look_bounds(ratios)
        if at_look is None:
            return self._judged(ratio, lo, hi, label, spread)
        # Several looks: each accepts at the same calibrated error (sequential.look_alpha); the interval shown
        # stays the single look's, for the reader, and the detail says which look decided.
        alpha, slower_bound, bound, look, looks = at_look
        need = self.speed_bound
        passed = bound < need
        detail = (f"{label} ratio {ratio:.3f} [{lo:.3f}, {hi:.3f}]; look {look} of {looks}: upper bound "
                  f"{bound:.3f} at one-sided {alpha:.4f} {'<' if passed else '>='} {need:.2f} {self._bound_word}")
        return Criterion("performance", passed, detail,
                         {"ratio": ratio, "ratio_ci_low": lo, "ratio_ci_high": hi, "ratio_needed": need,
                          "ratio_accept_bound": bound, "ratio_slower_bound": slower_bound, "look": float(look),
                          "looks": float(looks), **spread})

    def look_bounds(self, ratios: np.ndarray) -> tuple[float, float, float, int, int] | None:
        """Where the gate looks several times: (each look's one-sided error, the lower and upper bounds at it,
        which look these rounds are, how many looks); None with one look."""
        looks = self.round_looks()
        if len(looks) == 1:
            return None
        alpha = sequential.look_alpha(float(self.cfg.confidence), tuple(looks))
        _, low, high = rounds_ratio_ci(ratios, 1 - 2 * alpha)
        return alpha, low, high, max(1, sum(n <= len(ratios) for n in looks)), len(looks)

    def looked(self, rounds, challenger: str = "challenger", champion: str = "champion") -> tuple[Criterion, int]:
        """(the criterion, the rounds it took) as the rounds' looks would have decided on these rounds' first
        ones: a comparison among several (make bench-gate's) measured until every one is decided."""
        obj = self.cfg.objective
        ratios = rounds.ratios(challenger, champion, obj.metric, obj.stat)
        label = f"{obj.metric} {obj.stat} @c={rounds.concurrency}"
        used = self.decided_at(ratios) or len(ratios)
        return self.on_ratios(ratios[:used], f"{label}, {used} interleaved rounds"), used

    def decided_at(self, ratios: np.ndarray) -> int | None:
        """The first look that these rounds decide (its round count), or None while they decide none."""
        return next((n for n in self.round_looks() if n <= len(ratios) and self.ratios_decided(ratios[:n])), None)

    def round_looks(self) -> list[int]:
        rounds = self.cfg.get("interleaved") or {}
        return sequential.round_looks(int(rounds.get("rounds") or 0), rounds.get("max_rounds"))

    def rounds_decided(self, rounds, challenger: str = "challenger", champion: str = "champion") -> bool:
        obj = self.cfg.objective
        return self.ratios_decided(rounds.ratios(challenger, champion, obj.metric, obj.stat))

    def ratios_decided(self, ratios: np.ndarray) -> bool:
        """Stop adding rounds: accepted at this look's share of the error; or shown slower (its lower bound at
        the same share above 1); or not faster by its own estimate (ratio >= 1) or with no gain of min_gain left
        in its interval, unless it looks slower by as much as a gain must be faster (ratio >= 1 / (1 - min_gain)):
        such a one goes on until its slowdown is shown. Or the last look reached. A stop that does not accept
        cannot accept anything wrongly; a comparison that looks like no change stops early rather than at the
        last look. Aiming at memory: accepted, or shown slower than the slowdown allowed."""
        if len(ratios) >= self.round_looks()[-1]:
            return True
        crit = self.on_ratios(ratios)
        if not crit.numbers:                  # a round without successful requests: no look can pass
            return True
        n, need = crit.numbers, self.speed_bound
        if self.aim == "memory":
            return crit.passed or n["ratio_slower_bound"] > need
        not_faster = n["ratio"] >= 1 or n["ratio_ci_low"] >= need
        return crit.passed or n["ratio_slower_bound"] > 1 or (not_faster and n["ratio"] < 1 / need)

    def consistency(self, rounds, champion: BenchmarkReport, challenger: BenchmarkReport,
                    challenger_name: str = "challenger", champion_name: str = "champion") -> Criterion:
        """Is the rounds' comparison valid? Each side's objective in the rounds (median over rounds) against its
        own recorded run at that level (the champion's run, the challenger's load ladder): within
        `consistency.max_deviation` on each side, or beyond it on both sides together, the two having moved
        by the same factor within that tolerance (the machine's own speed drifts by up to a third over minutes
        here; the rounds, measured side by side, cancel what moved both). A side that moved alone means the
        rounds measured something else than the configurations (a disturbed process, a neighbour), unless the
        recorded runs alone pass the performance criterion too: then two independent measurements show the
        gain, and only its size is in doubt. And a gain the rounds show must show in the recorded runs too."""
        obj, c = self.cfg.objective, rounds.concurrency
        tolerance = float(self.cfg.consistency.max_deviation)
        sides = {"champion": (champion_name, champion), "challenger": (challenger_name, challenger)}
        numbers, off = {}, []
        for side, (name, recorded) in sides.items():
            was = _objective(recorded.level(c).values(obj.metric), obj.stat)
            now = float(np.median([_objective(lv.values(obj.metric), obj.stat) for lv in rounds.runs[name]]))
            deviation = now / was - 1 if was > 0 else math.inf
            numbers.update({f"{side}_rounds": now, f"{side}_recorded": was, f"{side}_deviation": deviation})
            if not abs(deviation) <= tolerance:
                off.append(f"{side} {obj.metric} {obj.stat} {now:.1f} in the rounds vs {was:.1f} in its own run "
                           f"({deviation:+.0%}, beyond ±{tolerance:.0%})")
        # how far the rounds moved the challenger relative to the champion: 0 when both moved alike
        relative = (1 + numbers["challenger_deviation"]) / (1 + numbers["champion_deviation"]) - 1
        together = abs(math.log1p(relative)) <= math.log1p(tolerance)
        recorded_ratio = numbers["challenger_recorded"] / numbers["champion_recorded"]
        rounds_ratio = float(np.nanmedian(rounds.ratios(challenger_name, champion_name, obj.metric, obj.stat)))
        numbers.update({"recorded_ratio": recorded_ratio, "rounds_ratio_median": rounds_ratio,
                        "relative_deviation": relative, "max_deviation": tolerance})
        moved = (f"champion {numbers['champion_deviation']:+.0%}, challenger {numbers['challenger_deviation']:+.0%}")
        recorded = self.performance(champion, challenger) if off and not together else None
        # the recorded runs' gain vouches for rounds that show a gain too, not for rounds that read a loss
        rounds_agree = self.aim != "speed" or rounds_ratio < 1
        if off and together:
            off, how = [], (f"consistent: both sides moved together ({moved}: the machine's speed, which the "
                            f"rounds cancel), the challenger {relative:+.0%} relative to the champion, within "
                            f"±{tolerance:.0%}")
        elif recorded is not None and recorded.passed and rounds_agree:
            numbers.update({"recorded_ratio_ci_high": recorded.numbers["ratio_ci_high"]})
            off, how = [], (f"consistent in its verdict: the sides moved apart ({moved}; the challenger "
                            f"{relative:+.0%} relative to the champion), but the recorded runs alone "
                            f"{'show the gain' if self.aim == 'speed' else 'pass'} too ({recorded.detail})")
        else:
            how = f"consistent: each side within ±{tolerance:.0%} of its own run ({moved})"
            if off:
                off.append(f"not a drift of both: the challenger {relative:+.0%} relative to the champion")
        if self.aim == "speed" and rounds_ratio < 1 and not recorded_ratio < 1:
            off.append(f"the rounds show a gain (ratio {rounds_ratio:.3f}) the recorded runs do not "
                       f"(challenger {numbers['challenger_recorded']:.1f} vs champion "
                       f"{numbers['champion_recorded']:.1f}: {recorded_ratio:.3f})")
        if off:
            return Criterion("consistency", False, "measurement inconsistent: " + "; ".join(off), numbers)
        return Criterion("consistency", True, how, numbers)

    def _judged(self, ratio: float, lo: float, hi: float, label: str, extra: dict) -> Criterion:
        need = self.speed_bound
        passed = hi < need
        detail = (f"{label} ratio {ratio:.3f} [{lo:.3f}, {hi:.3f}] {'<' if passed else '>='} {need:.2f} "
                  f"{self._bound_word}")
        return Criterion("performance", passed, detail,
                         {"ratio": ratio, "ratio_ci_low": lo, "ratio_ci_high": hi, "ratio_needed": need, **extra})

    def accuracy(self, champion: AccuracyReport, challenger: AccuracyReport) -> Criterion:
        """Non-inferiority, paired on the same documents: drop = mean(champion - challenger) per doc.

        Passes when the one-sided upper bound drop + z_needed * se stays within the tolerance, i.e. when
        z = (tolerance - drop) / se >= z_needed: the drop is significantly below the tolerance. A challenger
        scored at its first look of two (experiments/judge/sequential.py) passes only on the first look's stricter
        bound, fails when the drop's lower bound already exceeds the tolerance, and is otherwise undecided:
        the rest of the documents decide, on the last look's bound.
        """
        if missing := champion.missing(challenger.ids):
            return Criterion("accuracy", False, f"{champion.task}: the champion has no score for {len(missing)} of "
                                                f"the {len(challenger.per_doc)} documents scored")
        paired = champion.at(challenger.ids)
        diff = paired - np.asarray(challenger.per_doc)
        drop = float(diff.mean())
        se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
        confidence = float(self.cfg.confidence)
        z_single = float(stats.norm.ppf(confidence))
        planned, first = challenger.documents or len(diff), challenger.first_look
        look, z_needed, which_look = "", z_single, 0
        if 0 < first < planned:
            z_first, z_last = sequential.bounds(first / planned, confidence)
            at_first = len(diff) < planned
            z_needed, which_look = (z_first, 1) if at_first else (z_last, 2)
            look = f"{'first' if at_first else 'last'} look of two ({len(diff)} of {planned} documents), "
        upper = drop + z_needed * se
        tol, which = accuracy_tolerance(self.cfg.accuracy, champion.value)
        passed = upper <= tol
        z = (tol - drop) / se if se > 0 else (math.inf if drop <= tol else -math.inf)
        numbers = {"drop": drop, "drop_se": se, "drop_upper": upper, "tolerance": tol, "z": z,
                   "z_needed": z_needed, "documents": float(len(diff)),
                   "look": float(which_look), "documents_planned": float(planned)}   # look 0: one look only
        # both values over the documents compared: a champion may have scored more of them than the challenger
        detail = (f"{champion.task} {champion.metric} {np.mean(challenger.per_doc):.3f} vs {paired.mean():.3f}: {look}"
                  f"drop {drop:+.3f} (se {se:.3f}, upper {upper:+.3f}) {'<=' if passed else '>'} {tol:.3f} "
                  f"({which}); z {z:.2f} {'>=' if passed else '<'} {z_needed:.2f}")
        if not passed and look.startswith("first") and drop - z_single * se <= tol:
            return Criterion("accuracy", False, detail + ": undecided at the first look", numbers,
                             undecided=True)
        if not passed and drop - z_single * se <= tol:      # no drop beyond the tolerance shown either
            needed = documents_needed(diff, drop, tol, z_needed)
            numbers["documents_needed"] = float(needed or math.nan)
            more = f"it would need about {needed:,} documents" if needed else "its drop is not below the tolerance"
            return Criterion("accuracy", False, f"undecided: the task is too small to show a drop within the "
                                                f"tolerance ({more}); {detail}", numbers)
        return Criterion("accuracy", passed, detail, numbers)


def documents_needed(diff: np.ndarray, drop: float, tol: float, z: float) -> int | None:
    """Documents whose paired differences, as spread as these and with this mean drop, would put the drop's upper
    bound within the tolerance: (z * sd / (tol - drop))^2; None when the drop itself is not below it."""
    sd = float(diff.std(ddof=1)) if len(diff) > 1 else 0.0
    room = tol - max(drop, 0.0)
    return int(math.ceil((z * sd / room) ** 2)) if room > 0 and sd > 0 else None


def _objective(values, stat: str) -> float:
    return float(summary_stat(values, stat)) if len(values) else math.nan


def accuracy_tolerance(cfg_accuracy, champion_value: float) -> tuple[float, str]:
    """(the stricter of the configured tolerances, in points of the metric; how it was derived)."""
    found = tolerances(cfg_accuracy)
    options = []
    if "max_drop_abs" in found:
        options.append((found["max_drop_abs"], f"max_drop_abs {found['max_drop_abs']:g}"))
    if "max_drop_rel" in found:
        rel = found["max_drop_rel"]
        options.append((rel * abs(champion_value), f"max_drop_rel {rel:g} x {champion_value:.3f}"))
    return min(options)


def tolerances(cfg_accuracy) -> dict[str, float]:
    """The tolerances that are set (null = unused); their types and ranges are experiments/core/settings.py's,
    checked by check_config."""
    found = {key: float(cfg_accuracy[key]) for key in TOLERANCES if cfg_accuracy.get(key) is not None}
    if not found:
        raise ConfigError("gate.accuracy sets no tolerance (max_drop_abs and max_drop_rel are both null)",
                          "set gate.accuracy.max_drop_abs (points, e.g. 0.02) or max_drop_rel (share, e.g. 0.05)")
    return found


def check_config(cfg_gate) -> None:
    """Cheap checks of conf/gate before any long work starts: the types and ranges of its numbers (the
    settings table), then what relates them or is not a number."""
    check_section(cfg_gate, "gate")
    metric = cfg_gate.accuracy.get("metric")
    if metric is not None and (not isinstance(metric, str) or not METRIC_NAME.fullmatch(metric)):
        raise ConfigError(f"gate.accuracy.metric {metric!r} is not an lm-eval metric name",
                          "give the per-document metric without a filter suffix, e.g. acc_mutual_info "
                          "(not acc_mutual_info,none)")
    tolerances(cfg_gate.accuracy)
    interleaved = cfg_gate.get("interleaved")
    if interleaved is not None:
        sequential.check_rounds(interleaved, float(cfg_gate.confidence))
        if interleaved.rounds and (cfg_gate.get("consistency") or {}).get("max_deviation") is None:
            raise ConfigError(f"gate.consistency.max_deviation=None, but gate.interleaved.rounds="
                              f"{interleaved.rounds} checks each side's rounds against its own recorded run",
                              "give the largest tolerated deviation of a side's rounds from its own run, e.g. 0.25")
