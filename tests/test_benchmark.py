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
