"""Verdicts and tables agree (issue 16): each delta, and the waterfall's champion mark, is against the champion
the rung was gated against, not the baseline nor the final champion."""
from test_gate import bench_with_e2e

from experiments.judge.gate import Verdict
from experiments.record.outcome import RungOutcome, cell, markdown_table
from experiments.record.plots import champion_line, waterfall


def outcomes():
    base = RungOutcome("baseline", Verdict("accepted", "first"), bench=bench_with_e2e([100] * 10))
    fast = RungOutcome("onnxruntime", Verdict("accepted", "faster"), bench=bench_with_e2e([50] * 10),
                       champion_before=base)
    slow = RungOutcome("torch_compile", Verdict("rejected", "slower"), bench=bench_with_e2e([75] * 10),
                       champion_before=fast)
    skipped = RungOutcome("tensorrt", Verdict("skipped", "no CUDA"), champion_before=fast)
    return [base, fast, slow, skipped]


def test_a_delta_is_against_the_champion_gated_against():
    assert cell({"x": 75.0}, {"x": 50.0}, "x", "%.1f") == "75.0 (+50 %)"     # vs onnxruntime, not the baseline
    assert cell({"x": 75.0}, {}, "x", "%.1f") == "75.0"
    assert cell({}, {"x": 50.0}, "x", "%.1f") == "–"


def test_summary_md_names_the_champion_each_rung_was_gated_against():
    rows = markdown_table(outcomes(), 1).splitlines()
    assert rows[0].startswith("| rung | verdict | gated against |")
    assert rows[2].startswith("| baseline | accepted | – |")
    assert rows[3].startswith("| onnxruntime | accepted | baseline |")
    assert rows[4].startswith("| torch_compile | rejected | onnxruntime |")


def test_the_waterfall_marks_the_champion_each_rung_was_gated_against():
    assert champion_line(outcomes(), "e2e_ms", "mean", 1) == [(1, 100.0), (2, 50.0), (3, 50.0)]
    fig = waterfall(outcomes(), "e2e_ms", "mean", 1)
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "the champion it was gated against"


def test_an_accuracy_delta_pairs_the_documents_the_rung_scored():
    # The champion was completed to 1,200 documents (0.5 over them) after the rung passed on its first 400
    # (0.75 there, as the champion's): the row says +0 %, not +50 %.
    from test_sequential_accuracy import first, report

    from experiments.record.outcome import before_summary

    champion = report([1.0] * 300 + [0.0] * 100 + [1.0] * 300 + [0.0] * 500)
    base = RungOutcome("baseline", Verdict("accepted", "first"), bench=bench_with_e2e([100] * 10),
                       accuracy=[champion])
    rung = RungOutcome("int8", Verdict("accepted", "faster"), bench=bench_with_e2e([50] * 10),
                       champion_before=base, accuracy=[first(champion, 400)])
    assert before_summary(rung, 1)["accuracy"] == 0.75 and base.summary(1)["accuracy"] == 0.5
    assert cell(rung.summary(1), before_summary(rung, 1), "accuracy", "%.3f") == "0.750 (+0 %)"


def test_the_table_says_how_far_single_stream_decode_is_from_the_bandwidth_floor():
    import numpy as np
    import pytest

    from experiments.core.stats import LatencyStats

    base = RungOutcome("baseline", Verdict("accepted", "first"), bench=bench_with_e2e([100] * 10),
                       decode_floor_ms=2.0)
    base.bench.levels[0].stats["tpot_ms"] = LatencyStats.from_samples(np.array([10.0] * 10), 0.95)
    assert base.summary(1)["tpot_over_floor"] == pytest.approx(5.0)
    table = markdown_table([base], 1)
    assert "TPOT ÷ bandwidth floor" in table.splitlines()[0] and "| ×5.0 |" in table
    assert "bandwidth floor" not in markdown_table(outcomes(), 1)      # no roofline placed: no column
