"""A rung aiming at memory (`aim: memory`): judged on the memory it saves, at a speed that must not fall."""
from dataclasses import replace

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_gate import CONSISTENT, bench_with_e2e

from experiments.core.errors import ConfigError
from experiments.judge import memory_saving
from experiments.judge.gate import Gate, Verdict
from experiments.measure.interleaved import Rounds

MEMORY = OmegaConf.merge(CONSISTENT, {"memory": {"min_saving": 0.10, "max_slowdown": 0.05}})


def level(ms, rss_mb, **gpu):
    return replace(bench_with_e2e([ms] * 20).levels[0], rss_mb_max=rss_mb, **gpu)


def rounds_of(champion, challenger):
    """Rounds from per-round (e2e ms, RSS MB) pairs of each side."""
    return Rounds(1, {"champion": tuple(level(ms, mb) for ms, mb in champion),
                      "challenger": tuple(level(ms, mb) for ms, mb in challenger)})


def criteria(gate, rounds, champion, challenger):
    return [gate.interleaved(rounds), memory_saving.on_rounds(rounds, gate),
            gate.consistency(rounds, champion, challenger)]


def test_the_same_speed_in_a_third_less_memory_is_accepted_where_the_speed_gate_rejects_it():
    """llama.cpp's q8_0 KV cache as the ladder measured it (docs/results.md): 368 against 535 MB, E2E within a
    percent either way. Aimed at speed it is "no gain"; aimed at memory it is accepted, both numbers shown."""
    rng = np.random.default_rng(0)
    speed = 100 * np.exp(rng.normal(0, 0.01, 8))
    rounds = rounds_of([(100, 535 + d) for d in range(8)], [(ms, 368 + d) for d, ms in enumerate(speed)])
    recorded_champion, recorded_challenger = bench_with_e2e([100] * 20), bench_with_e2e([101] * 20)
    speed_gate = Gate(MEMORY)
    assert not speed_gate.interleaved(rounds).passed
    memory_gate = speed_gate.aimed_at("memory")
    verdict = Verdict.from_criteria(criteria(memory_gate, rounds, recorded_champion, recorded_challenger))
    assert verdict.accepted, verdict.reason
    saved = verdict.criteria[1]
    assert saved.name == "memory" and saved.numbers["memory_ratio"] == pytest.approx(368 / 535, rel=0.01)
    assert "RSS peak 372 vs 538 MB (medians over 8 rounds), ratio 0.690 [0.688, 0.691] < 0.90 needed" in saved.detail
    assert "< 1.05 allowed" in verdict.criteria[0].detail
    # a gain in the rounds that the recorded runs lack is the speed gate's rule; no gain is sought here
    assert memory_gate.without_rounds(recorded_champion, bench_with_e2e([130] * 20)) is None
    assert speed_gate.without_rounds(recorded_champion, bench_with_e2e([130] * 20)) is not None


@pytest.mark.parametrize("challenger, failing, words", [
    ([(100, 520)] * 8, "memory", "ratio 0.972 [0.972, 0.972] >= 0.90 needed"),          # saves 3 %: too little
    ([(112, 368)] * 8, "performance", ">= 1.05 allowed"),                              # saves, but 12 % slower
])
def test_too_small_a_saving_or_a_slowdown_is_rejected_with_its_numbers(challenger, failing, words):
    rounds = rounds_of([(100, 535)] * 8, challenger)
    gate = Gate(MEMORY, aim="memory")
    verdict = Verdict.from_criteria(criteria(gate, rounds, bench_with_e2e([100] * 20),
                                             bench_with_e2e([challenger[0][0]] * 20)))
    failed = [c for c in verdict.criteria if not c.passed]
    assert verdict.status == "rejected" and [c.name for c in failed] == [failing], verdict.reason
    assert words in failed[0].detail


def test_the_looks_keep_the_error_at_the_allowed_slowdown_and_accept_no_change():
    """Known answers for non-inferiority with looks of 8 up to 32 rounds and 5 % noise per round: a challenger
    exactly 5 % slower (the boundary) must be accepted at most as often as one look's 2.5 % (with the
    simulation's error); one as fast as the champion is accepted nearly always, and one 15 % slower is stopped
    before the last look."""
    rng = np.random.default_rng(7)
    gate = Gate(OmegaConf.merge(MEMORY, {"interleaved": {"rounds": 8, "max_rounds": 32}}), aim="memory")

    def decide(ratios):
        used = next(n for n in gate.round_looks() if n >= len(ratios) or gate.ratios_decided(ratios[:n]))
        return gate.on_ratios(ratios[:used]).passed, used

    def trials(true_ratio, n=400):
        return [decide(np.exp(rng.normal(np.log(true_ratio), 0.05, 32))) for _ in range(n)]

    boundary = np.mean([ok for ok, _ in trials(1.05, 1000)])
    same = trials(1.0)
    slower = trials(1.15)
    assert boundary <= 0.025 * 1.6, boundary
    assert np.mean([ok for ok, _ in same]) >= 0.9
    assert not any(ok for ok, _ in slower) and np.median([used for _, used in slower]) < 32


def test_the_rounds_go_on_until_speed_and_memory_both_pass_or_either_cannot():
    """A look before the last: stop when both pass, or when the slowdown allowed or the saving needed is out of
    reach; a speed that passes while the saving is still in doubt measures more rounds (not rejected early)."""
    from experiments.climb.rounds import _decided

    gate = Gate(OmegaConf.merge(MEMORY, {"interleaved": {"rounds": 8, "max_rounds": 32}}), aim="memory")
    rng = np.random.default_rng(1)
    steady = [(100, 535)] * 8

    def challenger(ms_noise, mb, mb_noise=0.0):
        return [(100 * np.exp(rng.normal(0, ms_noise)), mb * np.exp(rng.normal(0, mb_noise))) for _ in range(8)]

    both_pass = rounds_of(steady, challenger(0.01, 368))
    no_saving = rounds_of(steady, challenger(0.01, 530))
    much_slower = rounds_of(steady, [(130, 368)] * 8)
    saving_in_doubt = rounds_of(steady, challenger(0.01, 470, 0.08))
    speed_in_doubt = rounds_of(steady, challenger(0.15, 368))
    assert all(memory_saving.decided(gate, r) for r in (both_pass, no_saving, much_slower))
    assert not memory_saving.decided(gate, saving_in_doubt), memory_saving.on_rounds(saving_in_doubt, gate).detail
    assert not memory_saving.decided(gate, speed_in_doubt), gate.interleaved(speed_in_doubt).detail
    speed_gate = gate.aimed_at("speed")
    no_slos = bench_with_e2e([100] * 20)
    assert _decided(gate, no_slos)(saving_in_doubt) is False
    every = (both_pass, no_saving, much_slower, saving_in_doubt, speed_in_doubt)
    assert [_decided(speed_gate, no_slos)(r) for r in every] == [speed_gate.rounds_decided(r) for r in every]
    assert "look 1 of 4: upper bound" in memory_saving.on_rounds(both_pass, gate).detail


def test_the_devices_own_memory_is_compared_where_the_driver_reports_it():
    with_gpu = [level(100, 900, gpu_proc_mem_mb_max=4000.0, gpu_mem_mb_max=9000.0),
                level(100, 900, gpu_proc_mem_mb_max=3000.0, gpu_mem_mb_max=8000.0)]
    assert memory_saving.measure(with_gpu) == ("GPU memory", "gpu_proc_mem_mb_max")
    assert memory_saving.measure([level(100, 900)]) == ("RSS", "rss_mb_max")
    # device-wide only: it holds the paused rival too, so it compares nothing (and says so)
    device_only = [replace(lv, gpu_proc_mem_mb_max=None) for lv in with_gpu]
    assert memory_saving.measure(device_only) == (memory_saving.NO_GPU_FIGURE, None)
    rounds = Rounds(1, {"champion": (device_only[0],) * 8, "challenger": (device_only[1],) * 8})
    crit = memory_saving.on_rounds(rounds, Gate(MEMORY, aim="memory"))
    assert not crit.passed and crit.detail.startswith("memory: not compared: on a GPU, the driver reports no")


def test_recorded_runs_compare_one_reading_each():
    champion = bench_with_e2e([100] * 20)
    champion = type(champion)((replace(champion.levels[0], rss_mb_max=535.0),))
    challenger = type(champion)((replace(champion.levels[0], rss_mb_max=368.0),))
    crit = memory_saving.on_recorded(champion, challenger, Gate(MEMORY, aim="memory"))
    assert crit.passed and "RSS peak @c=1 368 vs 535 MB (one run each), ratio 0.688" in crit.detail


def test_a_rungs_aim_comes_from_its_file_and_a_wrong_one_is_refused_before_any_work(tmp_path):
    from conftest import compose

    from experiments.climb.validation import load_rungs

    rungs = dict(load_rungs(compose(["ladder=llama-cpp", f"data_dir={tmp_path}"])))
    assert rungs["kv_cache_dtype"].aim == "memory" and rungs["int8"].aim == "speed"
    with pytest.raises(ConfigError, match="rung 'int4' has aim 'size', which is not one of"):
        load_rungs(compose(["ladder=llama-cpp", "+ladder.rungs.int4.aim=size", f"data_dir={tmp_path}"]))
    with pytest.raises(ValueError, match="aim is one of"):
        Gate(MEMORY, aim="size")


def test_the_rung_measures_memory_in_the_rounds_it_judges_speed_in(monkeypatch, scratch_run):
    """rounds.performance, the rounds stubbed: aimed at memory, the rounds run although the recorded runs show no
    gain, and memory is judged in them; aimed at speed, the same challenger is rejected before any rounds."""
    from types import SimpleNamespace

    from experiments.climb import rounds as rung_rounds

    cfg = OmegaConf.create({"gate": OmegaConf.merge(MEMORY, {"interleaved": {
        "rounds": 8, "max_rounds": None, "seconds": 1.0, "min_requests": 1, "skip_without_recorded_gain": True}})})
    measured = rounds_of([(100, 535)] * 8, [(101, 368)] * 8)
    asked = []
    monkeypatch.setattr(rung_rounds, "_rounds", lambda *args: asked.append(args[3].aim) or measured)
    champion = SimpleNamespace(bench=bench_with_e2e([100] * 20), candidate=None)
    sweep = SimpleNamespace(cfg=cfg, gate=Gate(cfg.gate))
    by_memory = rung_rounds.performance(champion, bench_with_e2e([120] * 20), None, sweep, "kv", None, "memory").criteria
    by_speed = rung_rounds.performance(champion, bench_with_e2e([120] * 20), None, sweep, "kv", None).criteria
    assert [c.name for c in by_memory] == ["performance", "memory", "consistency", "slos"] and asked == ["memory"]
    assert all(c.passed for c in by_memory), [c.detail for c in by_memory]
    assert [c.name for c in by_speed] == ["performance", "slos"] and "decided without rounds" in by_speed[0].detail


def test_a_kv_cache_in_fewer_bits_aims_at_memory_except_where_vllm_budgets_it():
    from pathlib import Path

    from experiments.core.recipe import Candidate, Target
    from optimizers.baseline import EagerBaseline
    from optimizers.kv_cache_dtype import KvCacheDtype
    from optimizers.serving_engine import ServingEngineSwap

    rung = KvCacheDtype()
    rung.aim = "memory"
    base = EagerBaseline().apply(Candidate(Target("t", "causal-lm", Path("/x"))))
    on = lambda engine: ServingEngineSwap(engine).apply(base)  # noqa: E731
    assert rung.aim_for(on("llama.cpp")) == "memory" and rung.aim_for(on("vllm")) == "speed"
