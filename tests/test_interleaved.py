"""Champion re-measured beside the challenger in alternating rounds: the statistics, the order, the config."""
import time

import numpy as np
import pytest
from omegaconf import OmegaConf

from experiments import interleaved
from experiments.benchmark import LevelReport, Prompt, RequestRecord, SequentialServer, Workload
from experiments.errors import ConfigError
from experiments.gate import Gate
from experiments.interleaved import Rounds
from experiments.serving.engine import Engine
from experiments.stats import rounds_ratio_ci

GATE = OmegaConf.create({"objective": {"metric": "e2e_ms", "stat": "mean", "concurrency": "max"}, "min_gain": 0.05,
                         "confidence": 0.95, "bootstrap_resamples": 1000,
                         "accuracy": {"metric": "acc", "max_drop_abs": 0.02}})


def level(latencies_ms, concurrency=4) -> LevelReport:
    recs = []
    for i, ms in enumerate(latencies_ms):
        r = RequestRecord(Prompt(i, (1, 2, 3), 2), arrival=0.0, engine_start=0.0)
        r.token_times = [ms / 2e3, ms / 1e3]
        recs.append(r)
    return LevelReport(concurrency, 1.0, tuple(recs), {}, 0.0, 0.0, True)


def rounds_of(rng, champion_ms, challenger_ms, drift, n=60) -> Rounds:
    """Each round's machine speed (drift[r]) slows both servers alike; requests vary 10 % within a run."""
    return Rounds(4, {name: tuple(level(ms * d * rng.normal(1, 0.1, n)) for d in drift)
                      for name, ms in (("champion", champion_ms), ("challenger", challenger_ms))})


# --- statistics -----------------------------------------------------------------------------------------------
def test_round_ratio_interval_known_answers():
    assert rounds_ratio_ci([1.1, 1.1, 1.1], 0.95) == pytest.approx((1.1, 1.1, 1.1))
    ratio, lo, hi = rounds_ratio_ci([0.9, 1.1], 0.95)
    # t(0.975, 1 df) = 12.706; log-ratios +-0.1003 around -0.0050, sd 0.1419
    half = 12.7062 * np.std(np.log([0.9, 1.1]), ddof=1) / np.sqrt(2)
    assert ratio == pytest.approx(np.sqrt(0.99))
    assert (lo, hi) == pytest.approx((np.sqrt(0.99) * np.exp(-half), np.sqrt(0.99) * np.exp(half)))


def test_round_ratio_interval_covers_the_true_ratio_at_its_rate():
    rng = np.random.default_rng(7)
    trials = 4000
    ratios = 1.1 * np.exp(rng.normal(0, 0.05, (trials, 5)))
    covered = sum(lo <= 1.1 <= hi for _, lo, hi in (rounds_ratio_ci(r, 0.95) for r in ratios))
    assert 0.935 <= covered / trials <= 0.965


# --- the gate on rounds -----------------------------------------------------------------------------------------
def test_interleaved_gate_accepts_a_real_gain_and_not_noise():
    rng = np.random.default_rng(1)
    gate = Gate(GATE)
    drift = [1.0, 1.3, 0.9, 1.1, 1.0]
    faster = gate.interleaved(rounds_of(rng, 100, 70, drift))
    assert faster.passed and faster.numbers["ratio"] == pytest.approx(0.7, rel=0.03)
    assert faster.numbers["rounds"] == 5 and "5 interleaved rounds" in faster.detail
    same = gate.interleaved(rounds_of(rng, 100, 100, drift))
    assert not same.passed and same.numbers["ratio_ci_low"] <= 1 <= same.numbers["ratio_ci_high"]


def test_drift_between_recorded_runs_fools_the_bootstrap_but_not_the_rounds():
    """The champion was recorded on a quiet machine; an identical challenger runs while a neighbour takes 20 %."""
    from experiments.benchmark import BenchmarkReport

    rng = np.random.default_rng(2)
    gate = Gate(GATE)
    recorded = BenchmarkReport((level(100 * rng.normal(1, 0.1, 60)),))
    later = BenchmarkReport((level(120 * rng.normal(1, 0.1, 60)),))
    unpaired = gate.performance(recorded, later)
    assert unpaired.numbers["ratio_ci_low"] > 1.1            # "significantly slower": wrong, it is the machine
    paired = gate.interleaved(rounds_of(rng, 100, 100, [1.2, 1.2, 1.0, 1.2, 1.0]))
    assert paired.numbers["ratio_ci_low"] <= 1 <= paired.numbers["ratio_ci_high"]


def test_a_round_without_successful_requests_fails_with_the_reason():
    rng = np.random.default_rng(3)
    rounds = rounds_of(rng, 100, 100, [1.0, 1.0])
    broken = Rounds(4, {"champion": rounds.runs["champion"],
                        "challenger": (rounds.runs["challenger"][0], level([]))})
    crit = Gate(GATE).interleaved(broken)
    assert not crit.passed and "without successful requests" in crit.detail


# --- measuring ------------------------------------------------------------------------------------------------
class SteadyEngine(Engine):
    """Two tokens, each after a fixed busy compute."""
    name = "steady"

    def __init__(self, seconds_per_token):
        self.seconds = seconds_per_token

    def generate(self, prompt_ids, max_new_tokens):
        for _ in range(max_new_tokens):
            until = time.perf_counter() + self.seconds
            while time.perf_counter() < until:
                pass
            yield 0, self.seconds

    def lm_eval_model(self, batch_size):
        raise NotImplementedError

    def artefact_paths(self):
        return []


def test_measure_alternates_the_order_and_warms_up_once():
    prompts = tuple(Prompt(i, (1, 2, 3), 2) for i in range(50))
    bench = OmegaConf.create({"concurrency": [1], "warmup_requests": 3, "warmup_s": 0.0, "min_requests": 1,
                              "min_duration_s": 0.0, "max_duration_s": 10.0, "request_timeout_s": 5.0})
    rounds_cfg = OmegaConf.create({"rounds": 4, "seconds": 0.05, "min_requests": 5})
    servers = {"champion": SequentialServer(SteadyEngine(0.002)), "challenger": SequentialServer(SteadyEngine(0.001))}
    try:
        rounds = interleaved.measure(servers, Workload(prompts, prompts[:3]), bench, rounds_cfg, 2)
    finally:
        for s in servers.values():
            s.close()
    assert rounds.count == 4 and rounds.concurrency == 2
    starts = [(lv.started, name) for name, levels in rounds.runs.items() for lv in levels]
    order = [name for _, name in sorted(starts)]
    assert order == ["champion", "challenger", "challenger", "champion"] * 2
    assert all(len(lv.records) >= 5 and lv.duration_s >= 0.05 for levels in rounds.runs.values() for lv in levels)
    ratios = rounds.ratios("challenger", "champion", "e2e_ms", "mean")
    assert np.all(ratios < 0.8)                               # half the compute per token, in every round
    csv = rounds.to_csv("e2e_ms", "mean").splitlines()
    assert csv[0] == "round,champion_e2e_ms_mean,champion_requests,challenger_e2e_ms_mean,challenger_requests"
    assert len(csv) == 5


@pytest.mark.parametrize("change, message", [
    ({"rounds": 1}, "rounds=1 is not 0 or an integer >= 2"),
    ({"rounds": -2}, "rounds=-2"),
    ({"rounds": "five"}, "rounds='five'"),
    ({"seconds": 0}, "seconds=0 is not a positive number"),
    ({"min_requests": 0}, "min_requests=0 is not an integer >= 1"),
])
def test_bad_interleaved_config_is_one_clear_error(change, message):
    from experiments.gate import check_config

    cfg = OmegaConf.merge(GATE, {"interleaved": {"rounds": 5, "seconds": 2.0, "min_requests": 40, **change}})
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)


def test_zero_rounds_is_valid_and_means_the_recorded_run():
    from experiments.gate import check_config

    check_config(OmegaConf.merge(GATE, {"interleaved": {"rounds": 0, "seconds": 1.0, "min_requests": 1}}))
