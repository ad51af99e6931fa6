"""Known-answer tests of the load loop and metric definitions, on an engine with scripted timing."""
import time

import pytest
from omegaconf import OmegaConf

from experiments.core.request import Prompt
from experiments.measure.load_ladder import run_benchmark
from experiments.record import benchmark_log
from experiments.serving.engine import Engine
from experiments.targets.workload import Workload

CFG = OmegaConf.create({"concurrency": [1, 3], "warmup_requests": 2, "warmup_s": 0.0, "min_requests": 12,
                        "min_duration_s": 0.0, "max_duration_s": 30.0, "request_timeout_s": 5.0})


class ScriptedEngine(Engine):
    """Sleeps a fixed prefill then a fixed time per token; fails on prompt ids that are multiples of 5."""
    name = "scripted"

    def __init__(self, prefill_s=0.02, per_token_s=0.005, fail_every=0):
        self.prefill_s, self.per_token_s, self.fail_every = prefill_s, per_token_s, fail_every

    def generate(self, prompt_ids, max_new_tokens):
        if self.fail_every and prompt_ids[0] % self.fail_every == 0:
            raise RuntimeError("scripted failure")
        time.sleep(self.prefill_s)
        yield 7, self.prefill_s
        for _ in range(max_new_tokens - 1):
            time.sleep(self.per_token_s)
            yield 7, self.per_token_s

    def lm_eval_model(self, batch_size):
        raise NotImplementedError

    def artefact_paths(self):
        return []


def workload(n=40, out=5):
    prompts = tuple(Prompt(i, (i, 1, 2), out) for i in range(n))
    return Workload(prompts=prompts, warmup=tuple(Prompt(1000 + i, (1001 + i, 1), out) for i in range(4)))


def test_ttft_tpot_e2e_follow_the_definitions():
    report = run_benchmark(ScriptedEngine(), workload(), CFG)
    c1 = report.level(1)
    assert c1.n_ok >= 12
    assert c1.stats["ttft_ms"].p50.value == pytest.approx(20, abs=6)
    assert c1.stats["tpot_ms"].p50.value == pytest.approx(5, abs=2)
    assert c1.stats["e2e_ms"].p50.value == pytest.approx(20 + 4 * 5, abs=10)
    assert c1.stats["queue_ms"].p50.value < 3          # one client: nothing waits
    # three clients on a one-at-a-time server: each waits for the others, so queue time appears
    c3 = report.level(3)
    assert c3.stats["queue_ms"].p50.value > 20
    assert c3.stats["e2e_ms"].p50.value > c1.stats["e2e_ms"].p50.value
    assert c3.qps == pytest.approx(c1.qps, rel=0.35)   # no batching: throughput does not grow


def test_errors_are_counted_and_kept_out_of_percentiles():
    report = run_benchmark(ScriptedEngine(fail_every=5), workload(), OmegaConf.merge(CFG, {"concurrency": [1]}))
    lv = report.level(1)
    assert 0.1 < lv.error_rate < 0.35
    assert lv.stats["e2e_ms"].n == lv.n_ok < len(lv.records)
    assert "scripted failure" in benchmark_log.samples_csv(report)


def test_timeouts_are_counted():
    cfg = OmegaConf.merge(CFG, {"concurrency": [1], "min_requests": 3, "request_timeout_s": 0.01})
    lv = run_benchmark(ScriptedEngine(prefill_s=0.05), workload(), cfg).level(1)
    assert lv.timeout_rate == 1.0 and lv.stats["e2e_ms"] is None


def test_metric_series_are_stepped_by_concurrency():
    series = benchmark_log.metric_series(run_benchmark(ScriptedEngine(), workload(), CFG))
    assert [step for step, _ in series["output_tokens_per_s"]] == [1, 3]
    assert all(v > 0 for _, v in series["ttft_ms_p50"])


def test_zero_concurrency_is_refused():
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1"):
        run_benchmark(ScriptedEngine(), workload(), OmegaConf.merge(CFG, {"concurrency": [0]}))


# --- fresh prompts: no prompt sent twice to one server (issue 41) ------------------------------------------------
class ByteTokenizer:
    def encode(self, text, add_special_tokens=False):
        return list(text.encode())


def random_texts(seed=0, n=4, length=4000):
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(length)) for _ in range(n)]


class RecordingServer:
    """A server that keeps every prompt submitted to it, warm-ups included."""

    def __init__(self, server):
        self.server, self.sent = server, []

    def submit(self, prompt, intended=None):
        self.sent.append(prompt)
        return self.server.submit(prompt, intended)


def ladder_sent(wl, cfg=CFG):
    from experiments.measure.load_ladder import run_ladder
    from experiments.serving.servers import serve

    server = serve(ScriptedEngine(prefill_s=0.001, per_token_s=0.001))
    try:
        recording = RecordingServer(server)
        return run_ladder(recording, wl, cfg), recording.sent
    finally:
        server.close()


def test_a_synthetic_load_never_sends_one_server_a_prompt_twice_and_every_contender_gets_the_same_ones():
    wl = Workload.from_texts(random_texts(), ByteTokenizer(), [8, 16], [3], 4, 2, seed=1)
    report, sent = ladder_sent(wl)
    assert len(sent) >= 2 * (12 + 2)                     # two levels, each a warm-up of 2 and 12 measured
    assert len({p.token_ids for p in sent}) == len(sent) and len({p.id for p in sent}) == len(sent)
    # a second contender: at each level the same prompts, in the same order, so the levels compare like with like
    again, _ = ladder_sent(wl)
    for level in (1, 3):
        mine = sorted(r.prompt.id for r in report.level(level).records)
        theirs = sorted(r.prompt.id for r in again.level(level).records)
        common = min(len(mine), len(theirs))
        assert mine[:common] == theirs[:common]
    assert wl.prompts == tuple(wl.requests(0)[i] for i in range(4))     # `prompts`: the first of the first block
    assert wl.repeats is None


def test_only_what_the_workload_repeats_is_repeated():
    shared = Workload.from_texts(random_texts(), ByteTokenizer(), [8], [3], 4, 2, seed=1, shared_prefix_tokens=6)
    _, sent = ladder_sent(shared)
    assert len({p.token_ids[:6] for p in sent}) == 1 and len({p.token_ids for p in sent}) == len(sent)
    assert shared.repeats == "every prompt starts with the same 6 tokens"
    # a prompts file is the user's traffic: sent as given, cycled
    _, sent = ladder_sent(workload(n=5))
    assert {p.id for p in sent if p.id < 1000} == set(range(5)) and workload().repeats
    # a soak's next window continues its run where the last one stopped
    fresh = Workload.from_texts(random_texts(), ByteTokenizer(), [8], [3], 4, 2, seed=1)
    run = fresh.requests(7)
    assert run.after(5)[0] == run[5] and run[0] != fresh.requests(8)[0]


def test_both_sides_of_a_gate_round_send_the_same_fresh_block():
    from experiments.climb import contender
    from experiments.targets.workload import ROUNDS

    class Apart:                                      # records what each run would measure, in no process
        calls = []

        def run(self, what, fn, build, workload, load, concurrency, confidence, block):
            self.calls.append((what.split("-")[1], block))

    apart = Apart()
    with contender.round_runs({"champion": None, "challenger": None}, True, None, None, 2, 0.95, apart, 1) as runs:
        for _ in range(3):
            runs["challenger"]()
            runs["champion"]()
    blocks = {who: [b for w, b in apart.calls if w == who] for who in ("champion", "challenger")}
    assert blocks["champion"] == blocks["challenger"] == [ROUNDS, ROUNDS + 1, ROUNDS + 2]


def test_every_run_of_fresh_prompts_carries_the_same_mix_of_lengths():
    """Runs read different blocks (a level, the gate's rounds): their length mix is stratified, so a run's mean
    latency compares with another's (the gate's consistency check) without the noise of drawing lengths."""
    wl = Workload.from_texts(random_texts(), ByteTokenizer(), [8, 16, 24], [3, 5], 4, 2, seed=1)
    for block in (0, 1, 1000, 2000):
        run = wl.requests(block)
        mix = sorted((len(run[i].token_ids), run[i].max_new_tokens) for i in range(12))
        assert mix == sorted([(a, b) for a in (8, 16, 24) for b in (3, 5)] * 2)
