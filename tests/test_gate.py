import numpy as np
from omegaconf import OmegaConf

from experiments.accuracy import AccuracyReport
from experiments.benchmark import BenchmarkReport
from experiments.level import LevelReport
from experiments.serving.request import Prompt, RequestRecord
from experiments.gate import Gate, Verdict

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
    from experiments.slo import SLO

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
    slos = gate.slos(champion, challenger)
    assert not slos.passed and "p99_e2e_ms<=150 at c=1" in slos.detail
    assert gate.slos(champion, champion).passed
