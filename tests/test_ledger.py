"""The sweep's ledger: which finished rungs a new run of the same sweep keeps, and what it redoes."""
import pickle

import pytest
from conftest import compose

from experiments.core.errors import ConfigError
from experiments.record import ledger
from experiments.record.ledger import Entry, Ledger

NAMES = ["baseline", "torch_compile", "onnxruntime", "openvino"]
MACHINE = {"cpu": "Test CPU", "cores_logical": 2, "versions": {"torch": "2.13.0"}, "git_commit": "abc"}


def keys(*overrides, machine=MACHINE):
    cfg = compose(["data_dir=/tmp/unused", *overrides])
    key = ledger.sweep_key(cfg, machine)
    return key, ledger.rung_keys(cfg, NAMES, key)


def test_a_rung_config_change_invalidates_that_rung_and_those_after_only():
    sweep, before = keys()
    same_sweep, after = keys("ladder.rungs.onnxruntime.execution_provider=cuda")
    assert sweep == same_sweep
    assert [before[n] == after[n] for n in NAMES] == [True, True, False, False]


def test_a_rungs_own_limit_counts_for_it_and_the_global_isolation_settings_do_not():
    _, before = keys()
    assert [before[n] == keys("+isolation.rungs.torch_compile.time_limit_s=60")[1][n] for n in NAMES] == \
        [True, False, False, False]
    assert keys("isolation.enabled=false", "isolation.time_limit_s=60")[1] == before


def test_load_data_gate_or_machine_changes_start_a_new_sweep_and_labels_do_not():
    sweep, _ = keys()
    assert keys("benchmark.concurrency=[1,2]")[0] != sweep
    assert keys(machine={**MACHINE, "cpu": "Another CPU"})[0] != sweep
    assert keys(machine={**MACHINE, "git_commit": "def"})[0] == sweep          # code: said on resume, not a reset
    assert keys("tracking.ui_port=5001")[0] == sweep and keys("resume=false")[0] == sweep
    assert keys("diagnosis.profile.decode_steps=3")[0] == sweep                 # runs after the ladder only


def _book(tmp_path, key="k0"):
    book = Ledger(tmp_path, "roi-ladder/tiny-llm", "tiny-llm", key)
    book.begin("parent-1", "20261203-120000", [])
    return book


def _again(tmp_path, key="k0"):
    return Ledger(tmp_path, "roi-ladder/tiny-llm", "tiny-llm", key)


def _finish(book, name, key, outcomes):
    book.started(name, key, f"run-{name}")
    book.child(4242)
    outcomes[name] = {"rung": name}
    book.done({"verdict": "accepted"}, {"outcomes": dict(outcomes), "reference": "ref", "scores": {}})


def test_resume_keeps_finished_rungs_and_redoes_the_interrupted_one(tmp_path):
    book, outcomes = _book(tmp_path), {}
    for name in ("baseline", "torch_compile"):
        _finish(book, name, f"key-{name}", outcomes)
    book.started("onnxruntime", "key-onnxruntime", "run-onnxruntime")      # then: SIGKILL
    resume, why = _again(tmp_path).resumable({n: f"key-{n}" for n in NAMES})
    assert [e.name for e in resume.kept] == ["baseline", "torch_compile"]
    assert [(e.name, e.status, e.run_id) for e in resume.stale] == [("onnxruntime", "running", "run-onnxruntime")]
    assert resume.parent_run_id == "parent-1" and resume.state["outcomes"]["torch_compile"] == {"rung": "torch_compile"}
    assert "2 rung(s) done and kept" in why and "onnxruntime interrupted" in why


def test_a_changed_rung_is_redone_with_those_after_it(tmp_path):
    book, outcomes = _book(tmp_path), {}
    for name in NAMES[:3]:
        _finish(book, name, f"key-{name}", outcomes)
    book.finish("interrupted")
    changed = {n: f"key-{n}" for n in NAMES} | {"torch_compile": "new", "onnxruntime": "new2"}
    resume, _ = _again(tmp_path).resumable(changed)
    assert [e.name for e in resume.kept] == ["baseline"]
    assert [(e.name, e.status) for e in resume.stale] == [("torch_compile", "done"), ("onnxruntime", "done")]


def test_no_resume_after_a_finished_sweep_or_with_another_config(tmp_path):
    book, outcomes = _book(tmp_path), {}
    _finish(book, "baseline", "key-baseline", outcomes)
    assert _again(tmp_path, "other").resumable({"baseline": "key-baseline"})[0] is None   # another ledger file
    book.finish("finished")
    resume, why = _again(tmp_path).resumable({"baseline": "key-baseline"})
    assert resume is None and why == "the last sweep with this config finished"


def test_a_tampered_or_outdated_state_is_never_loaded(tmp_path):
    book, outcomes = _book(tmp_path), {}
    _finish(book, "baseline", "key-baseline", outcomes)
    good = book.state_path.read_bytes()
    blob = bytearray(good)
    blob[-3] ^= 0xFF
    book.state_path.write_bytes(bytes(blob))
    resume, _ = _again(tmp_path).resumable({"baseline": "key-baseline"})
    assert resume.kept == [] and [e.name for e in resume.stale] == ["baseline"]   # redone, not loaded
    import hashlib
    import hmac
    old = pickle.dumps({"version": 0, "outcomes": {"baseline": 1}})            # an older layout, validly signed
    secret = (tmp_path / "ledger" / ".hmac-key").read_bytes()
    book.state_path.write_bytes(hmac.new(secret, old, hashlib.sha256).digest() + old)
    assert _again(tmp_path).resumable({"baseline": "key-baseline"})[0].kept == []


def test_one_copy_of_a_sweep_at_a_time(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from experiments.record.ledger import Ledger; "
        f"book = Ledger(Path({str(tmp_path)!r}), 'roi-ladder/tiny-llm', 'tiny-llm', 'k0'); book.lock(); print('locked', "
        "flush=True); time.sleep(60)")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=rf"already running here \(pid {holder.pid}\)"):
            _again(tmp_path).lock()
        other = _again(tmp_path, "k1")
        other.lock()                                          # another config: its own ledger
    finally:
        holder.kill()
        holder.wait()
    _again(tmp_path).lock()                                   # the holder is gone: free again


def test_the_ledger_names_runs_and_recipes_and_the_key_is_private(tmp_path):
    book, outcomes = _book(tmp_path), {}
    _finish(book, "baseline", "key-baseline", outcomes)
    entry = Entry(**book.doc["rungs"][0])
    assert (entry.run_id, entry.status, entry.pid, entry.verdict) == ("run-baseline", "done", None, "accepted")
    assert oct((tmp_path / "ledger" / ".hmac-key").stat().st_mode & 0o777) == "0o600"
