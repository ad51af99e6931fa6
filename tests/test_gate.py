import numpy as np
import pytest
from omegaconf import OmegaConf

from experiments.core.reports import BenchmarkReport, LevelReport
from experiments.core.request import Prompt, RequestRecord
from experiments.judge.accuracy import AccuracyReport
from experiments.judge.gate import Gate, Verdict

GATE = OmegaConf.create({"objective": {"metric": "e2e_ms", "stat": "p50", "concurrency": 1}, "min_gain": 0.05,
                         "confidence": 0.95, "bootstrap_resamples": 1000,
                         "accuracy": {"metric": "acc", "max_drop_abs": 0.02}})


def bench_with_e2e(latencies_ms) -> BenchmarkReport:
    """Requests whose token timestamps give the wanted end-to-end latencies (2 tokens each)."""
    recs = []
    for i, ms in enumerate(latencies_ms):
        r = RequestRecord(Prompt(i, (1, 2, 3), 2), arrival=0.0, engine_start=0.0)
        r.token_times = [ms / 2e3, ms / 1e3]
        recs.append(r)
    return BenchmarkReport((LevelReport(1, 1.0, tuple(recs), {}, 0.0, 0.0, True),))


def acc(per_doc):
    per_doc = np.asarray(per_doc, float)
    return AccuracyReport("t", "acc", float(per_doc.mean()), 0.0, tuple(per_doc))


def test_clear_speedup_passes_and_noise_does_not():
    rng = np.random.default_rng(0)
    champion = bench_with_e2e(rng.normal(100, 10, 60))
    faster = bench_with_e2e(rng.normal(60, 6, 60))
    same = bench_with_e2e(rng.normal(100, 10, 60))
    gate = Gate(GATE)
    assert gate.performance(champion, faster).passed
    crit = gate.performance(champion, same)
    assert not crit.passed and crit.numbers["ratio_ci_high"] > 0.95


def test_accuracy_is_judged_paired_against_tolerance():
    base = acc([1, 0, 1, 1, 0, 1, 0, 1] * 50)
    gate = Gate(GATE)
    assert gate.accuracy(base, acc(base.per_doc)).passed              # identical answers: no drop at all
    broken = acc([0] * 400)                                           # lost everything it knew
    crit = gate.accuracy(base, broken)
    assert not crit.passed and crit.numbers["drop"] > 0.5


def test_verdict_lists_every_failing_criterion():
    gate = Gate(GATE)
    champion, same = bench_with_e2e([100.0] * 30), bench_with_e2e([100.0] * 30)
    v = Verdict.from_criteria([gate.performance(champion, same),
                               gate.accuracy(acc([1] * 40), acc([0] * 40))])
    assert v.status == "rejected" and "ratio" in v.reason and "drop" in v.reason
    assert len(v.criteria) == 2


def test_objective_at_max_reads_the_highest_level_and_slos_must_hold():
    from experiments.core.slo import SLO
    from experiments.judge import slo_verdict

    def two_levels(c1_ms, c4_ms, slos=()):
        one, four = bench_with_e2e(c1_ms).levels[0], bench_with_e2e(c4_ms).levels[0]
        four = LevelReport(4, 1.0, four.records, {}, 0.0, 0.0, True)
        return BenchmarkReport((one, four), tuple(slos))

    slo = SLO.parse("p99_e2e_ms<=150")
    champion = two_levels([100.0] * 40, [400.0] * 40, [slo])
    challenger = two_levels([300.0] * 40, [200.0] * 40, [slo])     # faster at c=4, but breaks c=1's SLO
    cfg = OmegaConf.merge(GATE, {"objective": {"concurrency": "max", "stat": "mean"}})
    gate = Gate(cfg)
    perf = gate.performance(champion, challenger)
    assert perf.passed and "@c=4" in perf.detail and perf.numbers["ratio"] == 0.5
    slos = slo_verdict.criterion(champion, challenger, 0.95)
    assert not slos.passed and "p99_e2e_ms<=150 at c=1" in slos.detail
    assert slo_verdict.criterion(champion, champion, 0.95).passed


# --- consistency of the rounds with each side's own run (issue 16) -------------------------------------------
CONSISTENT = OmegaConf.merge(GATE, {"objective": {"stat": "mean"}, "consistency": {"max_deviation": 0.25}})


def rounds_at(champion_ms, challenger_ms, n=6):
    from experiments.measure.interleaved import Rounds

    level = lambda ms: bench_with_e2e([ms] * 20).levels[0]   # noqa: E731
    return Rounds(1, {"champion": tuple(level(champion_ms) for _ in range(n)),
                      "challenger": tuple(level(challenger_ms) for _ in range(n))})


def test_rounds_that_agree_with_each_sides_own_run_are_consistent():
    crit = Gate(CONSISTENT).consistency(rounds_at(110, 60), bench_with_e2e([100] * 20), bench_with_e2e([50] * 20))
    assert crit.passed and crit.name == "consistency"
    assert crit.numbers["champion_deviation"] == pytest.approx(0.10)
    assert crit.numbers["challenger_deviation"] == pytest.approx(0.20)
    assert crit.numbers["recorded_ratio"] == pytest.approx(0.5)
    assert crit.numbers["rounds_ratio_median"] == pytest.approx(60 / 110)


def test_a_champion_slowed_in_the_rounds_makes_the_comparison_invalid_with_both_numbers():
    # issue 16's numbers: the champion at ~2,000 ms in the rounds against 679 ms in its own run
    crit = Gate(CONSISTENT).consistency(rounds_at(2000, 1800), bench_with_e2e([679] * 20), bench_with_e2e([1800] * 20))
    assert not crit.passed
    assert crit.detail.startswith("measurement inconsistent: champion e2e_ms mean 2000.0 in the rounds vs 679.0 "
                                  "in its own run (+195%, beyond ±25%)")
    assert crit.numbers["champion_deviation"] == pytest.approx(2000 / 679 - 1)
    # and the rounds' gain (0.9) is not in the recorded runs (1800 vs 679): said too
    assert "the rounds show a gain (ratio 0.900) the recorded runs do not" in crit.detail


def test_a_challenger_off_its_own_load_ladder_is_inconsistent_at_the_tolerance_edge():
    # recorded, the challenger is 5 % faster: not the gain the performance criterion needs on its own
    gate = Gate(CONSISTENT)
    champion, challenger = bench_with_e2e([100] * 20), bench_with_e2e([96] * 20)
    assert gate.consistency(rounds_at(100, 120), champion, challenger).passed      # +25 %: within
    crit = gate.consistency(rounds_at(100, 121), champion, challenger)
    assert not crit.passed and "challenger e2e_ms mean 121.0 in the rounds vs 96.0 in its own run (+26%" in crit.detail


def test_both_sides_beyond_the_tolerance_by_one_factor_are_the_machines_drift_and_consistent():
    # a fresh clone's make sweep (5fa2dca): the machine ~40 % faster in the rounds than at the baseline's own run;
    # onnxruntime's 12x gain was rejected as inconsistent when each side was judged alone
    crit = Gate(CONSISTENT).consistency(rounds_at(748, 59), bench_with_e2e([1289] * 20), bench_with_e2e([100] * 20))
    assert crit.passed, crit.detail
    assert crit.numbers["champion_deviation"] == pytest.approx(748 / 1289 - 1)          # -42 %
    assert crit.numbers["challenger_deviation"] == pytest.approx(-0.41)
    assert crit.numbers["relative_deviation"] == pytest.approx(0.59 / (748 / 1289) - 1)  # +2 %
    assert crit.detail.startswith("consistent: both sides moved together (champion -42%, challenger -41%")


@pytest.mark.parametrize("relative, passed", [
    (1.249, True),     # both beyond, the challenger +25 % relative to the champion: the edge
    (1.26, False),
    (0.801, True),     # -20 %: 1/1.25, the same distance on a log scale
    (0.79, False),
])
def test_how_far_both_sides_may_move_apart_is_the_tolerance_on_a_log_scale(relative, passed):
    crit = Gate(CONSISTENT).consistency(rounds_at(748, 1250 * 748 / 1289 * relative), bench_with_e2e([1289] * 20),
                                        bench_with_e2e([1250] * 20))      # recorded, 3 % faster: no gain alone
    assert crit.passed is passed, crit.detail
    assert crit.numbers["relative_deviation"] == pytest.approx(relative - 1)


def test_one_side_beyond_the_tolerance_alone_is_inconsistent_and_says_it_was_not_a_drift_of_both():
    # the champion 40 % faster than its own run, the challenger as in its own: not the machine, something else
    champion, challenger = bench_with_e2e([100] * 20), bench_with_e2e([97] * 20)   # recorded: no gain alone
    crit = Gate(CONSISTENT).consistency(rounds_at(60, 97), champion, challenger)
    assert not crit.passed
    assert crit.detail == ("measurement inconsistent: champion e2e_ms mean 60.0 in the rounds vs 100.0 in its own run "
                           "(-40%, beyond ±25%); not a drift of both: the challenger +67% relative to the champion")
    # both beyond the tolerance, in opposite directions: inconsistent too
    crit = Gate(CONSISTENT).consistency(rounds_at(58, 126.1), champion, challenger)
    assert not crit.passed and crit.detail.endswith("not a drift of both: the challenger +124% relative to the champion")
    assert crit.numbers["relative_deviation"] == pytest.approx((126.1 / 97) / 0.58 - 1)


def test_sides_that_moved_apart_are_valid_when_the_recorded_runs_alone_show_the_gain():
    # a fresh make sweep (1bf1831): onnxruntime 277 ms in its own run against the compiled champion's 1700 ms,
    # 377 ms in the rounds against 1570: the size of the gain is in doubt, not the gain
    crit = Gate(CONSISTENT).consistency(rounds_at(1570, 377), bench_with_e2e(list(np.linspace(1600, 1800, 20))),
                                        bench_with_e2e(list(np.linspace(260, 294, 20))))
    assert crit.passed, crit.detail
    assert crit.detail.startswith("consistent in its verdict: the sides moved apart (champion -8%, challenger +36%; "
                                  "the challenger +47% relative to the champion), but the recorded runs alone show "
                                  "the gain too (e2e_ms mean @c=1 ratio 0.163 [")
    assert crit.numbers["recorded_ratio_ci_high"] < 0.95


def test_a_gain_only_the_rounds_show_is_inconsistent_even_within_the_tolerance():
    # each side within 25 % of its own run, but recorded the challenger is slower: tables and verdict would disagree
    crit = Gate(CONSISTENT).consistency(rounds_at(110, 90), bench_with_e2e([95] * 20), bench_with_e2e([100] * 20))
    assert not crit.passed and "recorded runs do not" in crit.detail
    assert crit.numbers["recorded_ratio"] == pytest.approx(100 / 95)


def test_a_challenger_not_faster_in_its_own_run_is_rejected_before_any_rounds():
    gate, champion = Gate(CONSISTENT), bench_with_e2e(list(np.linspace(90, 110, 20)))
    decided = gate.without_rounds(champion, bench_with_e2e(list(np.linspace(95, 115, 20))))     # 5 % slower
    assert decided is not None and not decided.passed and decided.name == "performance"
    assert decided.detail.startswith("decided without rounds, the recorded runs show no gain")
    assert decided.numbers["ratio"] == pytest.approx(105 / 100)
    assert gate.without_rounds(champion, bench_with_e2e(list(np.linspace(85, 105, 20)))) is None   # faster: rounds
    # the tie is no gain: rejected too; too few requests to tell: the rounds decide
    assert gate.without_rounds(champion, champion) is not None
    assert gate.without_rounds(champion, bench_with_e2e([100])) is None
