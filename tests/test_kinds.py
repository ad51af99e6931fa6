"""A target kind says what its requests measure and what its throughput is; the measuring and reporting code
asks it, so a third kind is one module in experiments/targets/kinds/ (here a reranker, scoring query/passage pairs)."""
import sys
import types

import pytest

from experiments.core.names import Metric
from experiments.core.reports import BenchmarkReport, LevelReport
from experiments.core.request import Prompt, RequestRecord
from experiments.core.stats import LatencyStats
from experiments.judge.gate import Verdict
from experiments.record import benchmark_log, plots as report_plots, registry, ui
from experiments.record.console import level_table
from experiments.record.outcome import RungOutcome, markdown_table
from experiments.targets import kinds


class RerankerKind(kinds.Kind):
    name = "reranker"
    metrics = (Metric.E2E_MS, Metric.QUEUE_MS, Metric.MODEL_MS)
    throughput_unit = "pairs/s"
    key_metrics = ("e2e_ms_p50", "pairs_per_s")

    def columns(self, top):
        return [("e2e_ms_p50", "E2E p50 ms (c=1)", "%.2f"), ("throughput", f"pairs/s (c={top})", "%.0f")]

    def throughput(self, level):
        return 8 * level.qps   # 8 passages scored per request

    def level_metrics(self, level):
        return {"pairs_per_s": self.throughput(level)}


@pytest.fixture
def reranker(monkeypatch):
    module = types.ModuleType("experiments.targets.kinds.reranker")
    module.KIND = RerankerKind()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(kinds, "names", lambda: ("causal-lm", "embedding", "reranker"))
    return module.KIND


def report(kind: str) -> BenchmarkReport:
    recs = []
    for i in range(20):
        r = RequestRecord(Prompt(i, (1, 2, 3), 1), arrival=0.0, engine_start=0.001, model_s=0.004)
        r.token_times = [0.005 + i * 1e-4]
        recs.append(r)
    level = LevelReport(1, 2.0, tuple(recs), {}, 50.0, 100.0, True)
    level.stats.update({m: LatencyStats.from_samples(level.values(m)) for m in kinds.kind_of(kind).metrics})
    return BenchmarkReport((level,), kind=kind)


def test_a_third_kind_names_its_throughput_everywhere_without_touching_the_reporting_code(reranker):
    bench = report("reranker")
    series = benchmark_log.metric_series(bench)
    assert series["pairs_per_s"] == [(1, 80.0)] and series["qps"] == [(1, 10.0)]
    assert not [k for k in series if k.startswith(("ttft", "tpot", "output_tokens", "embeddings"))]
    assert {"e2e_ms_p50", "queue_ms_p50", "model_ms_p50"} <= set(series)
    header = benchmark_log.samples_csv(bench).splitlines()[0].split(",")
    row = benchmark_log.samples_csv(bench).splitlines()[1].split(",")
    assert row[header.index(Metric.TTFT_MS)] == "" and float(row[header.index(Metric.E2E_MS)]) == 5.0

    outcome = RungOutcome("baseline", Verdict("accepted", "first champion"), bench=bench)
    assert outcome.summary(1)["throughput"] == 80.0
    table = markdown_table([outcome], 1)
    assert "pairs/s (c=1)" in table and "| 80 |" in table
    assert "pairs/s" in [c.header for c in level_table(bench).columns]
    # the UI's ladder view and a promoted version's tags show the kind's own figures
    assert ui.ladder_view("run-1", reranker.key_metrics)["selectedColumns"][:2] == \
        ["metrics.`e2e_ms_p50`", "metrics.`pairs_per_s`"]
    logged = {"e2e_ms_p50": 5.0, "pairs_per_s": 80.0, "qps": 10.0, "accuracy/rr/ndcg": 0.5}
    assert registry.key_metrics(logged, "reranker") == {"e2e_ms_p50": 5.0, "pairs_per_s": 80.0, "accuracy/rr/ndcg": 0.5}
    assert report_plots.throughput_vs_latency(bench).axes[0].get_ylabel() == "pairs/s"


def test_the_shipped_kinds_throughput(reranker):
    decoder, encoder = report("causal-lm"), report("embedding")
    assert set(benchmark_log.metric_series(decoder)) >= {"output_tokens_per_s"} and "embeddings_per_s" not in benchmark_log.metric_series(decoder)
    assert benchmark_log.metric_series(encoder)["embeddings_per_s"] == [(1, 10.0)]
    assert kinds.kind_of("embedding").throughput(encoder.levels[0]) == 10.0
    assert kinds.kind_of("causal-lm").throughput(decoder.levels[0]) == 10.0   # one token per request here
    logged = {"e2e_ms_p50": 5.0, "tpot_ms_p50": 1.0, "output_tokens_per_s": 9.0, "embeddings_per_s": 10.0}
    assert set(registry.key_metrics(logged, "causal-lm")) == {"e2e_ms_p50", "tpot_ms_p50", "output_tokens_per_s"}
    assert set(registry.key_metrics(logged, "embedding")) == {"e2e_ms_p50", "embeddings_per_s"}
