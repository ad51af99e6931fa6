"""The sweep's ledger: which finished rungs a new run of the same sweep keeps, and what it redoes."""
from conftest import compose
from experiments import ledger
from experiments.ledger import Entry, Ledger

NAMES = ["baseline", "torch_compile", "onnxruntime", "openvino"]


def keys(*overrides):
    cfg = compose(["data_dir=/tmp/unused", *overrides])
    return ledger.sweep_key(cfg), ledger.rung_keys(cfg, NAMES)


def test_a_rung_config_change_invalidates_that_rung_and_those_after_only():
    sweep, before = keys()
    same_sweep, after = keys("ladder.rungs.onnxruntime.execution_provider=cuda")
    assert sweep == same_sweep
    assert [before[n] == after[n] for n in NAMES] == [True, True, False, False]


def test_a_per_rung_limit_counts_as_that_rungs_config():
    _, before = keys()
    _, after = keys("+isolation.rungs.torch_compile.time_limit_s=60")
    assert [before[n] == after[n] for n in NAMES] == [True, False, False, False]


def test_a_sweep_wide_change_invalidates_everything_and_labels_do_not():
    sweep, before = keys()
    assert keys("benchmark.concurrency=[1,2]")[0] != sweep
    assert keys("tracking.ui_port=5001")[0] == sweep and keys("resume=false")[0] == sweep


def _book(tmp_path, sweep_key="k0"):
    book = Ledger(tmp_path, "roi-ladder/tiny-llm", "tiny-llm")
    book.begin(sweep_key, "parent-1", "20261203-120000", [])
    return book


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
    keys_now = {n: f"key-{n}" for n in NAMES}
    resume, why = Ledger(tmp_path, "roi-ladder/tiny-llm", "tiny-llm").resumable("k0", keys_now)
    assert [e.name for e in resume.kept] == ["baseline", "torch_compile"]
    assert [(e.name, e.status, e.run_id) for e in resume.stale] == [("onnxruntime", "running", "run-onnxruntime")]
    assert resume.parent_run_id == "parent-1" and resume.state["outcomes"]["torch_compile"] == {"rung": "torch_compile"}
    assert "2 rung(s) done and kept" in why and "onnxruntime running" in why


def test_a_changed_rung_is_redone_with_those_after_it(tmp_path):
    book, outcomes = _book(tmp_path), {}
    for name in NAMES[:3]:
        _finish(book, name, f"key-{name}", outcomes)
    book.finish("interrupted")
    changed = {n: f"key-{n}" for n in NAMES} | {"torch_compile": "new", "onnxruntime": "new2"}
    resume, _ = Ledger(tmp_path, "roi-ladder/tiny-llm", "tiny-llm").resumable("k0", changed)
    assert [e.name for e in resume.kept] == ["baseline"]
    assert [(e.name, e.status) for e in resume.stale] == [("torch_compile", "done"), ("onnxruntime", "done")]


def test_no_resume_after_a_finished_sweep_or_another_config(tmp_path):
    book, outcomes = _book(tmp_path), {}
    _finish(book, "baseline", "key-baseline", outcomes)
    again = Ledger(tmp_path, "roi-ladder/tiny-llm", "tiny-llm")
    assert again.resumable("other", {"baseline": "key-baseline"})[0] is None
    book.finish("finished")
    resume, why = again.resumable("k0", {"baseline": "key-baseline"})
    assert resume is None and why == "the last sweep finished"


def test_a_tampered_state_is_never_unpickled(tmp_path):
    book, outcomes = _book(tmp_path), {}
    _finish(book, "baseline", "key-baseline", outcomes)
    blob = bytearray(book.state_path.read_bytes())
    blob[-3] ^= 0xFF
    book.state_path.write_bytes(bytes(blob))
    resume, _ = Ledger(tmp_path, "roi-ladder/tiny-llm", "tiny-llm").resumable("k0", {"baseline": "key-baseline"})
    assert resume.kept == [] and [e.name for e in resume.stale] == ["baseline"]   # redone, not loaded


def test_the_ledger_names_runs_and_recipes_and_the_key_is_private(tmp_path):
    book, outcomes = _book(tmp_path), {}
    _finish(book, "baseline", "key-baseline", outcomes)
    entry = Entry(**book.doc["rungs"][0])
    assert (entry.run_id, entry.status, entry.pid, entry.verdict) == ("run-baseline", "done", None, "accepted")
    assert oct((tmp_path / "ledger" / ".hmac-key").stat().st_mode & 0o777) == "0o600"
