"""Issue 42: rounds that disagree with a side's recorded run. The side that strayed has its recorded run measured
again; a disturbed recorded run is found out and the comparison stands; where nothing settles it the rung is
undecided, not rejected."""
from types import SimpleNamespace

import mlflow
import pytest
from omegaconf import OmegaConf
from test_gate import CONSISTENT, bench_with_e2e, rounds_at

from experiments.climb import rounds as rung_rounds
from experiments.judge import consistency
from experiments.judge.gate import Criterion, Gate, Verdict

CFG = OmegaConf.create({
    "gate": OmegaConf.merge(CONSISTENT, {"interleaved": {"rounds": 6, "max_rounds": None, "seconds": 1.0,
                                                         "min_requests": 1, "skip_without_recorded_gain": False}}),
    "benchmark": {"mode": "closed", "concurrency": [1]}})


def judged(monkeypatch, run, rounds: list, again_ms: float, champion_ms=700.0, challenger_ms=687.0):
    """rounds.performance with the rounds and the re-measured recorded run stubbed: `rounds` the rounds of each
    attempt, `again_ms` what the strayed side's recorded run reads when measured again."""
    calls = {"rounds": 0, "again": []}

    def fake_rounds(*args):
        calls["rounds"] += 1
        return rounds[calls["rounds"] - 1]

    def fake_again(cand, sweep, name, apart, c, side):
        calls["again"].append(side)
        return bench_with_e2e([again_ms] * 20).levels[0]

    monkeypatch.setattr(rung_rounds, "_rounds", fake_rounds)
    monkeypatch.setattr(rung_rounds, "_recorded_again", fake_again)
    champion = SimpleNamespace(bench=bench_with_e2e([champion_ms] * 20), candidate="champion-recipe")
    sweep = SimpleNamespace(cfg=CFG, gate=Gate(CFG.gate))
    judged = rung_rounds.performance(champion, bench_with_e2e([challenger_ms] * 20), "challenger-recipe", sweep,
                                     "swap", None)
    calls["judged"] = judged
    tags = mlflow.get_run(run.info.run_id).data.tags
    return {c.name: c for c in judged.criteria}, calls, tags


def test_a_clean_swap_whose_own_run_was_disturbed_is_decided_on_its_run_measured_again(monkeypatch, scratch_run):
    # issue 42's numbers: the challenger 458.1 in the rounds, 687.0 in its own run; the champion agrees with its own
    crit, calls, tags = judged(monkeypatch, scratch_run, [rounds_at(700, 458.1)], again_ms=470.0)
    assert calls["rounds"] == 1 and calls["again"] == ["challenger"]
    # the run measured again replaces the disturbed one in what the table and later rungs read
    assert calls["judged"].challenger.levels[0].values("e2e_ms").mean() == pytest.approx(470.0)
    c = crit["consistency"]
    assert c.passed and not c.undecided, c.detail
    assert "the challenger's own run, measured again in a fresh process, read 470.0 (first 687.0, rounds 458.1): " \
           "its first run was the disturbed one" in c.detail
    assert c.numbers["challenger_first_recorded"] == pytest.approx(687.0)
    assert c.numbers["challenger_recorded"] == pytest.approx(470.0)
    assert tags["roi.gate.recorded_again"] == c.detail
    assert Verdict.from_criteria(list(crit.values())).status == "accepted"


def test_a_run_measured_again_that_confirms_itself_puts_the_rounds_in_doubt_and_then_it_is_undecided(monkeypatch,
                                                                                                     scratch_run):
    inconsistent = rounds_at(700, 458.1)
    crit, calls, tags = judged(monkeypatch, scratch_run, [inconsistent, inconsistent], again_ms=690.0)
    assert calls["rounds"] == 2 and calls["again"] == ["challenger"]
    c = crit["consistency"]
    assert not c.passed and c.undecided
    assert c.detail.startswith("the measurement stayed inconsistent after the challenger's own run and "
                               "the rounds measured again: challenger e2e_ms mean 458.1 in the rounds vs 690.0"), c.detail
    # what the second rounds' criterion says still names the run measured again and its first figure
    assert "measured again in a fresh process, read 690.0 (first 687.0, rounds 458.1)" in c.detail
    assert c.numbers["challenger_first_recorded"] == pytest.approx(687.0)
    assert "inconsistent, measured again" in tags["roi.gate.first_measurement"]
    verdict = Verdict.from_criteria(list(crit.values()))
    assert verdict.status == "undecided", verdict.reason


def test_rounds_measured_again_that_agree_with_the_recorded_runs_decide(monkeypatch, scratch_run):
    # the first rounds were the disturbed measurement: the second agree with both recorded runs, and show no gain
    crit, calls, _ = judged(monkeypatch, scratch_run, [rounds_at(700, 458.1), rounds_at(700, 690.0)], again_ms=689.0)
    assert calls["rounds"] == 2 and calls["again"] == ["challenger"]
    assert crit["consistency"].passed
    verdict = Verdict.from_criteria(list(crit.values()))
    assert verdict.status == "rejected" and "ratio 0.986" in verdict.reason, verdict.reason


def test_a_slower_challenger_on_rounds_that_stay_inconsistent_is_undecided_not_rejected(monkeypatch, scratch_run):
    # the rounds read the challenger slower, its own run (twice) faster: which is right is not known
    inconsistent = rounds_at(700, 900.0)
    crit, calls, _ = judged(monkeypatch, scratch_run, [inconsistent, inconsistent], again_ms=600.0,
                            challenger_ms=600.0)
    assert calls["rounds"] == 2 and calls["again"] == ["challenger"]
    assert crit["performance"].undecided and "(on rounds that disagree with the recorded runs)" in \
        crit["performance"].detail
    assert Verdict.from_criteria(list(crit.values())).status == "undecided"


def test_a_champion_whose_own_run_was_disturbed_is_measured_again_and_passed_on(monkeypatch, scratch_run):
    # the champion read 1000 in its own run, 700 in the rounds and in a run measured again: the recorded runs'
    # "gain" (800 vs 1000) was the champion's disturbed run, and the challenger is rejected on consistent rounds
    crit, calls, _ = judged(monkeypatch, scratch_run, [rounds_at(700, 800.0)], again_ms=705.0, champion_ms=1000.0,
                            challenger_ms=800.0)
    assert calls["again"] == ["champion"] and crit["consistency"].passed, crit["consistency"].detail
    assert calls["judged"].champion.levels[0].values("e2e_ms").mean() == pytest.approx(705.0)
    assert crit["consistency"].numbers["champion_first_recorded"] == pytest.approx(1000.0)
    assert Verdict.from_criteria(list(crit.values())).status == "rejected"


def test_the_champion_is_measured_again_where_it_strayed():
    crit = Gate(CONSISTENT).consistency(rounds_at(2000, 1800), bench_with_e2e([679] * 20), bench_with_e2e([1800] * 20))
    assert consistency.strayed(crit) == "champion"
    crit = Gate(CONSISTENT).consistency(rounds_at(700, 458), bench_with_e2e([700] * 20), bench_with_e2e([687] * 20))
    assert consistency.strayed(crit) == "challenger"
    nan = Criterion("consistency", False, "", {"champion_deviation": 0.4, "challenger_deviation": float("nan")})
    assert consistency.strayed(nan) == "challenger"


def test_undecided_only_where_nothing_failed_on_evidence():
    undecided = Criterion("consistency", False, "undecided: …", undecided=True)
    passed, failed = Criterion("performance", True, "ok"), Criterion("fidelity", False, "drifted")
    assert Verdict.from_criteria([passed, undecided]).status == "undecided"
    assert Verdict.from_criteria([passed, undecided, failed]).status == "rejected"
    assert Verdict.from_criteria([passed]).status == "accepted"
