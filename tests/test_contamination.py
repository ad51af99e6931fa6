"""Issue 16's regression: a contender that disturbs the process it is built in (background threads that burn CPU
whenever it is not serving, left running after it is closed) must not be accepted. When the champion was rebuilt
in the challenger's process for the gate's rounds, it ran beside those threads, measured slower, and the
challenger, no faster at all, was accepted; each run in a process of its own measures the configurations."""
import subprocess

import pytest
from conftest import REPO
from test_resilience import _cmd, _env, _runs

pytestmark = pytest.mark.slow


def test_a_contender_that_slows_its_neighbours_in_process_is_not_accepted(tmp_path):
    # scores are not what this test is about: few documents and windows (the gate still scores both sides)
    proc = subprocess.run(_cmd(tmp_path, "ladder=engine-swap", "~ladder.rungs.onnxruntime", "soak.enabled=false",
                               "accuracy.limit=40", "gate.fidelity.sequences=4",
                               # the rounds always run: they are what is tested (not the recorded runs' verdict).
                               # An A/A comparison: at 95 % the gate may accept one in 40 by design (CI saw it twice,
                               # 8 rounds at 0.85 the last time); at 99 % one in 200, while a
                               # contamination (the champion ~2x slower) is still accepted in 16 rounds.
                               "gate.interleaved.skip_without_recorded_gain=false", "gate.confidence=0.99",
                               "gate.interleaved.rounds=16", "gate.interleaved.min_requests=16",
                               "+ladder.rungs.disturbing={_target_:faults.Disturbing}", profile="quick"),
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rungs = {r.data.tags["roi.rung"]: r for r in _runs(tmp_path) if r.data.tags.get("roi.kind") == "rung"}
    assert rungs["baseline"].data.tags["roi.verdict"] == "accepted"
    disturbing = rungs["disturbing"].data
    assert disturbing.params["recipe.engine"] == "faults:DisturbingEngine"
    reason = disturbing.tags["roi.reason"]
    # the same recipe as the champion, each side alone in its process: no gain to find (or, on a machine busy
    # enough that a side strayed from its own run and its rounds, no valid comparison: undecided, never accepted)
    if disturbing.tags["roi.verdict"] == "undecided":
        assert "the measurement stayed inconsistent" in reason, reason
    else:
        assert disturbing.tags["roi.verdict"] == "rejected", reason
        assert disturbing.metrics["gate/performance/ratio_ci_high"] >= 0.95, reason
    assert disturbing.tags["roi.measurement"].startswith("each measurement in a fresh process of its own")
