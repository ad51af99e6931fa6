"""make bench-ladder's report: verdict counts per rung, the rungs at a boundary with what decided each sweep, and
how often the champion was the same."""
from rich.console import Console

from experiments.benchmarks.ladder_repeat import Sweep, deciding, report

SPEED = {"gate/performance/ratio": 0.93, "gate/performance/ratio_ci_low": 0.89,
         "gate/performance/ratio_ci_high": 0.97, "gate/performance/ratio_needed": 0.95}


def test_a_rung_whose_verdict_changed_is_shown_with_what_decided_each_sweep():
    def sweep(int8: str, champion: str) -> Sweep:
        return Sweep(600.0, champion, {"baseline": "accepted", "onnxruntime": "accepted", "int8": int8},
                     {"baseline": "the first champion", "onnxruntime": "speed ratio 0.2", "int8": f"int8 {int8}"})

    sweeps = [sweep("accepted", "int8"), sweep("rejected", "onnxruntime"), sweep("accepted", "int8")]
    md = report(sweeps, Console(file=open("/dev/null", "w")))
    assert "| int8 | 2 | 1 | 0 | 0 | 0 | NO |" in md
    assert "| onnxruntime | 3 | 0 | 0 | 0 | 0 | yes |" in md
    assert "champion: int8 in 2 of 3 sweeps (67%, 95 % CI [9%, 99%]); int8: 2, onnxruntime: 1" in md
    assert "**int8** at a boundary:\n- sweep 1: accepted, int8 accepted\n- sweep 2: rejected, int8 rejected" in md
    assert "**onnxruntime** at a boundary" not in md


def test_what_decided_a_rung_names_the_criteria_that_did_not_pass_and_the_speed_beside_them():
    rejected = {"roi.verdict": "rejected", "roi.gate.performance": "pass: ratio …",
                "roi.gate.slos": "FAIL: SLO shown lost: p95_ttft_ms<=100 at c=1", "roi.gate.interleaved": "how"}
    assert deciding(rejected, SPEED) == ("slos: SLO shown lost: p95_ttft_ms<=100 at c=1; "
                                         "speed ratio 0.930 [0.890, 0.970] (< 0.95 needed)")
    slower = {"roi.verdict": "rejected", "roi.gate.performance": "FAIL: e2e_ms mean @c=8 …"}
    assert deciding(slower, SPEED) == "speed ratio 0.930 [0.890, 0.970] (< 0.95 needed)"
    undecided = {"roi.verdict": "undecided", "roi.gate.consistency": "undecided: the measurement stayed inconsistent"}
    assert deciding(undecided, {}) == "consistency: the measurement stayed inconsistent"
    accepted = {"roi.verdict": "accepted", "roi.reason": "all passed"}
    assert deciding(accepted, SPEED) == "speed ratio 0.930 [0.890, 0.970] (< 0.95 needed)"
    assert deciding({"roi.verdict": "skipped", "roi.reason": "no CUDA"}, {}) == "no CUDA"
