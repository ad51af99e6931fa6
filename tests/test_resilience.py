"""Sweeps that lose nothing: rungs that segfault, blow their memory or hang fail with a reason while the sweep
finishes; a sweep stopped by Ctrl-C, then SIGKILLed, resumes with no duplicate runs in the MLflow store."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO, SHARED_CACHE
from mlflow.tracking import MlflowClient
from verdicts import assert_decided

pytestmark = pytest.mark.slow


def _cmd(data, *overrides, profile="plumbing"):
    """A sweep into `data`; by default on the plumbing profile (one level, 20 documents, no rounds, no soak): what
    these tests check is what survives a crash or a stop, not what was measured."""
    return [sys.executable, "-m", "experiments.cli", "sweep", f"profile={profile}", f"data_dir={data}",
            f"cache_dir={SHARED_CACHE}", *overrides]


def _env():
    return {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _runs(data):
    client = MlflowClient(tracking_uri=f"sqlite:///{data}/mlflow.db")
    exp = client.get_experiment_by_name("roi-ladder/tiny-llm")
    return client.search_runs([exp.experiment_id], max_results=1000)


def test_segfault_memory_blowup_and_hang_fail_with_reasons_and_the_sweep_finishes(tmp_path):
    started = time.monotonic()
    proc = subprocess.run(_cmd(tmp_path, "ladder=engine-swap", "~ladder.rungs.onnxruntime",
                               "+ladder.rungs.segfault={_target_:faults.Segfault}",
                               "+ladder.rungs.memory_hog={_target_:faults.MemoryHog}",
                               "+ladder.rungs.hang={_target_:faults.Hang}",
                               "+isolation.rungs.memory_hog={memory_limit_gb:2}",
                               "+isolation.rungs.hang={time_limit_s:15}"),
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = _runs(tmp_path)
    rungs = {r.data.tags["roi.rung"]: r for r in runs if r.data.tags.get("roi.kind") == "rung"}
    parent = next(r for r in runs if r.data.tags.get("roi.kind") == "sweep")
    assert sorted(rungs) == ["baseline", "hang", "memory_hog", "segfault"]
    reasons = {n: r.data.tags["roi.reason"] for n, r in rungs.items()}
    assert rungs["baseline"].data.tags["roi.verdict"] == "accepted"
    for name, expected in (("segfault", "died of SIGSEGV (segmentation fault)"), ("memory_hog", "memory limit hit"),
                           ("hang", "time limit hit: still running after 15 s")):
        tags = rungs[name].data.tags
        assert tags["roi.verdict"] == "failed" and expected in reasons[name], reasons[name]
        assert tags["roi.reverted_to"] == rungs["baseline"].info.run_id    # the champion did not change
        assert tags["roi.champion_before"] == rungs["baseline"].info.run_id
    assert "faults.py" in reasons["segfault"]                      # the last log lines carry the stack
    assert rungs["memory_hog"].data.metrics["isolation/peak_rss_bytes"] > 2 * 2**30
    assert parent.data.tags["roi.champion_rung"] == "baseline" and parent.info.status == "FINISHED"
    assert "hang: failed" in proc.stdout
    assert time.monotonic() - started < 900


def _ledger(data):
    found = list((data / "ledger").glob("roi-ladder_tiny-llm--tiny-llm--*.json"))   # one sweep config: one ledger
    assert len(found) <= 1, found
    try:
        return json.loads(found[0].read_text()) if found else {}
    except (FileNotFoundError, ValueError):
        return {}


def _wait_for_child(data, rung, proc, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = [e for e in _ledger(data).get("rungs", []) if e["name"] == rung and e["pid"]]
        if entries:
            return entries[-1]["pid"]
        assert proc.poll() is None, f"the sweep ended before {rung} started: {proc.stdout.read()[-3000:]}"
        time.sleep(0.3)
    raise AssertionError(f"{rung} did not start in {timeout} s")


def _gone(pid, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.2)
    return False


def test_ctrl_c_then_sigkill_then_resume_leaves_one_run_per_rung(tmp_path):
    cmd = _cmd(tmp_path, "ladder=engine-swap", "+rung@ladder.rungs.int8=int8")
    popen = dict(cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    # 1. Ctrl-C during onnxruntime: that rung finishes and is recorded, then the sweep stops
    first = subprocess.Popen(cmd, **popen)
    _wait_for_child(tmp_path, "onnxruntime", first)
    first.send_signal(signal.SIGINT)
    out = first.communicate(timeout=600)[0]
    assert first.returncode == 130, out[-3000:]
    assert "finishing the current step" in out and "resume from int8" in out
    ledger = _ledger(tmp_path)
    assert ledger["status"] == "interrupted"
    assert [(e["name"], e["status"]) for e in ledger["rungs"]] == [("baseline", "done"), ("onnxruntime", "done")]

    # 2. SIGKILL during int8: nothing is cleaned up by the sweep; its rung process dies with it
    second = subprocess.Popen(cmd, **popen)
    child = _wait_for_child(tmp_path, "int8", second)
    time.sleep(2)
    second.kill()
    out = second.communicate(timeout=60)[0]
    assert "resuming sweep" in out and "2 rung(s) done and kept" in out, out[-3000:]
    assert _gone(child), "the killed sweep's rung process lives on"
    killed = {r.data.tags["roi.rung"]: r for r in _runs(tmp_path) if r.data.tags.get("roi.rung") == "int8"}
    assert killed["int8"].info.status == "RUNNING"          # as the SIGKILL left it

    # 3. the same command again: only int8 is redone
    third = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    runs = _runs(tmp_path)
    parents = [r for r in runs if r.data.tags.get("roi.kind") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED" and "roi.resumed" in parents[0].data.tags
    configs = [a.path for a in MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db").list_artifacts(
        parents[0].info.run_id, "config")]
    assert "config/resolved.yaml" in configs and len([c for c in configs if "resumed-" in c]) == 2
    by_rung = {}
    for r in runs:
        if r.data.tags.get("roi.kind") == "rung":
            by_rung.setdefault(r.data.tags["roi.rung"], []).append(r)
    assert {n: len(rs) for n, rs in by_rung.items()} == {"baseline": 1, "onnxruntime": 1, "int8": 2}
    interrupted = [r for r in by_rung["int8"] if r.data.tags["roi.verdict"] == "interrupted"]
    redone = [r for r in by_rung["int8"] if r.data.tags["roi.verdict"] != "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].info.status == "KILLED"
    assert len(redone) == 1
    assert_decided(redone[0].data, "int8")
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for rs in by_rung.values() for r in rs)
    assert _ledger(tmp_path)["status"] == "finished"
    print(f"runs in the store: {len(runs)} (1 sweep, baseline 1, onnxruntime 1, int8 2 of which 1 KILLED)")
