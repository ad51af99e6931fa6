"""The OpenAI-compatible endpoint over the tiny model, and the benchmark driving endpoints through HTTP."""
import json
import socket
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from conftest import SHARED_CACHE, compose
from omegaconf import OmegaConf

from experiments.core.errors import ConfigError
from experiments.core.request import Prompt
from experiments.measure.load_ladder import run_ladder
from experiments.record import benchmark_log
from experiments.serving.http_client import EndpointServer
from experiments.serving.http_server import FAILURE_POLL_S, BackgroundServer, bind, create_app, exposure_warning
from experiments.serving.servers import SequentialServer
from experiments.targets.workload import Workload

LOAD = OmegaConf.create({"concurrency": [1, 2], "warmup_requests": 2, "warmup_s": 0.0, "min_requests": 6,
                         "min_duration_s": 0.0, "max_duration_s": 30.0, "request_timeout_s": 10.0})


def small_workload(n=12, out=8) -> Workload:
    return Workload(prompts=tuple(Prompt(i, (10 + i, 20, 30, 40), out) for i in range(n)),
                    warmup=tuple(Prompt(100 + i, (50 + i, 7), out) for i in range(3)))


class Recording:
    """The candidate's server, keeping the records the HTTP handlers submit, to compare with what was sent."""

    def __init__(self, server):
        self.server, self.records = server, []

    def submit(self, prompt, intended=None):
        rec = self.server.submit(prompt, intended)
        self.records.append(rec)
        return rec


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def endpoint(tiny_target, tokenizer):
    from experiments.core.recipe import Candidate
    from experiments.serving.backends.pytorch.causal_lm import TorchEngine

    server = SequentialServer(TorchEngine(Candidate(tiny_target), threads=1))
    recording = Recording(server)
    with BackgroundServer(create_app(recording, tokenizer, "tiny-llm")) as http:
        yield http.url, recording
    server.close()


def sse_events(response) -> list[tuple[float, str]]:
    """(arrival time, data) per server-sent event, stamped as each line arrives."""
    return [(time.perf_counter(), line.removeprefix("data: ")) for line in response.iter_lines() if line]


# --- the server -------------------------------------------------------------------------------------------
def test_stream_sends_each_token_as_it_is_produced(endpoint):
    url, recording = endpoint
    body = {"model": "tiny-llm", "prompt": "def read(self, path):", "max_tokens": 32, "stream": True}
    with httpx.Client(timeout=30) as client:
        for _ in range(3):
            with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                events = sse_events(r)
            assert events[-1][1] == "[DONE]"
            chunks = [json.loads(data) for _, data in events[:-1]]
            assert len(chunks) == 32
            assert {c["object"] for c in chunks} == {"text_completion"} and len({c["id"] for c in chunks}) == 1
            assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 31 + ["length"]
            produced = recording.records[-1].token_times
            arrived = [t for t, _ in events[:-1]]
            # streamed, not buffered: the first chunk was here before the engine produced the last token
            assert arrived[0] < produced[-1]
            lags = [a - p for a, p in zip(arrived, produced)]
            assert min(lags) > 0
            # each token is pushed to the handler as it is produced, not found by its fallback poll
            assert statistics.median(lags) < FAILURE_POLL_S / 5
        whole = client.post(f"{url}/v1/completions", json={**body, "stream": False}).json()
    # the streamed text is the whole completion, split per token
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]


def test_non_stream_answers_with_usage(endpoint, tokenizer):
    url, _ = endpoint
    ids = tokenizer.encode("import os\nimport sys\n", add_special_tokens=False)
    r = httpx.post(f"{url}/v1/completions", json={"prompt": ids, "max_tokens": 5, "ignore_eos": True}, timeout=30)
    assert r.status_code == 200
    out = r.json()
    assert out["object"] == "text_completion" and out["model"] == "tiny-llm"
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 5, "total_tokens": len(ids) + 5}
    assert out["choices"][0]["finish_reason"] == "length" and out["choices"][0]["text"]
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny-llm"
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def test_metrics_answer_in_prometheus_format(endpoint):
    from prometheus_client.parser import text_string_to_metric_families

    url, _ = endpoint

    def read() -> dict:
        page = httpx.get(f"{url}/metrics")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
        return {s.name: s.value for f in text_string_to_metric_families(page.text) for s in f.samples}

    before = read()
    assert httpx.post(f"{url}/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 5}, timeout=30).status_code == 200
    after = read()
    assert after["roi_ladder_requests_total"] == before["roi_ladder_requests_total"] + 1
    assert after["roi_ladder_prompt_tokens_total"] == before["roi_ladder_prompt_tokens_total"] + 3
    assert after["roi_ladder_generation_tokens_total"] == before["roi_ladder_generation_tokens_total"] + 5
    assert after["roi_ladder_num_requests_running"] == 0


@pytest.mark.parametrize("body, says", [
    ({"prompt": "", "max_tokens": 4}, "prompt is empty"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 99999]}, "outside the vocabulary"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": "x", "n": 2}, "n"),
])
def test_bad_request_is_400_with_an_openai_error(endpoint, body, says):
    url, _ = endpoint
    r = httpx.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and says in error["message"]


def test_not_json_and_unknown_model_are_refused(endpoint):
    url, _ = endpoint
    r = httpx.post(f"{url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/completions", json={"model": "gpt-4", "prompt": "x"})
    assert r.status_code == 404 and "tiny-llm" in r.json()["error"]["message"]


def test_a_client_that_goes_away_frees_the_engine(endpoint):
    url, recording = endpoint
    body = {"prompt": [10, 20, 30], "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        next(r.iter_lines())
    rec = recording.records[-1]
    assert rec.done.wait(10), "the engine kept generating for a client that left"
    assert rec.cancelled and len(rec.tokens) < 2000


class CharTokenizer:
    """One character per token: enough for the server, without a model."""

    def __len__(self):
        return 100

    def decode(self, ids, skip_special_tokens=True):
        return "a" * len(ids)


def test_a_fast_engines_first_token_is_not_held_back():
    from test_benchmark import ScriptedEngine

    server = Recording(SequentialServer(ScriptedEngine(prefill_s=0.001, per_token_s=0.0005)))
    with BackgroundServer(create_app(server, CharTokenizer(), "m")) as http:
        client = EndpointServer(http.url)
        try:
            lags = []
            for i in range(6):
                rec = client.submit(Prompt(i, (10, 20, 30), 32))
                assert rec.done.wait(10) and rec.ok
                lags.append(rec.token_times[0] - server.records[-1].token_times[0])
        finally:
            client.close()
    server.server.close()
    # Without TCP_NODELAY on the served connection, Nagle holds the first chunk behind the headers until the
    # client's delayed ACK: ~40 ms on every request of a keep-alive connection.
    assert statistics.median(lags) < 0.010


def test_an_engine_failure_is_an_error_not_a_hang():
    from test_benchmark import ScriptedEngine

    server = SequentialServer(ScriptedEngine(fail_every=5))
    with BackgroundServer(create_app(server, CharTokenizer(), "m")) as http:
        r = httpx.post(f"{http.url}/v1/completions", json={"prompt": [5, 1], "max_tokens": 4}, timeout=10)
        assert r.status_code == 500 and "scripted failure" in r.json()["error"]["message"]
        client = EndpointServer(http.url)
        try:
            rec = client.submit(Prompt(0, (10, 1), 4))
            assert rec.done.wait(10)
        finally:
            client.close()
    server.close()
    assert rec.error == "endpoint error: the engine failed: RuntimeError: scripted failure"


def test_binds_loopback_by_default_and_warns_otherwise(tokenizer):
    with BackgroundServer(create_app(Recording(None), tokenizer, "m")) as http:
        assert http.address[0] == "127.0.0.1"
        with pytest.raises(ConfigError, match="cannot listen on 127.0.0.1"):
            bind("127.0.0.1", http.address[1])
    assert exposure_warning("127.0.0.1") is None and exposure_warning("localhost") is None
    assert "no authentication" in exposure_warning("0.0.0.0")


# --- the client: the benchmark through HTTP ---------------------------------------------------------------
def test_endpoint_mode_measures_our_server(endpoint):
    url, _ = endpoint
    client = EndpointServer(url + "/v1", timeout_s=10)
    try:
        assert client.model == "tiny-llm"
        report = run_ladder(client, small_workload(), LOAD)
    finally:
        client.close()
    assert [lv.concurrency for lv in report.levels] == [1, 2]
    for lv in report.levels:
        assert len(lv.records) >= 6 and lv.error_rate == 0 and lv.timeout_rate == 0
        assert lv.stats["ttft_ms"].n == lv.n_ok == len(lv.records)
        assert 0 < lv.stats["ttft_ms"].p50.value < lv.stats["e2e_ms"].p50.value
        assert all(len(r.token_times) == 8 for r in lv.records)
        # behind an endpoint, queueing and compute cannot be told apart: absent, not made up
        assert lv.stats["queue_ms"] is None and lv.stats["model_ms"] is None
    assert "queue_ms" not in benchmark_log.metric_series(report) and benchmark_log.metric_series(report)["qps"][1][0] == 2


def test_text_prompts_reach_the_endpoint_too(endpoint, tokenizer):
    url, recording = endpoint
    client = EndpointServer(url, "tiny-llm", prompt_format="text", tokenizer=tokenizer, timeout_s=10)
    try:
        ids = tuple(tokenizer.encode("def main():\n    return 0\n", add_special_tokens=False))
        rec = client.submit(Prompt(0, ids, 4))
        assert rec.done.wait(10)
    finally:
        client.close()
    assert rec.ok and len(rec.token_times) == 4 and recording.records[-1].prompt.token_ids == ids


def test_unreachable_endpoint_is_one_clear_error():
    with socket.socket() as s:     # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match=f"endpoint http://127.0.0.1:{port} is unreachable: connection refused") as e:
        EndpointServer(f"http://127.0.0.1:{port}")
    assert "roi-ladder serve" in e.value.fix
    with pytest.raises(ConfigError, match="not an http"):
        EndpointServer("127.0.0.1:8000")


# A stand-in for a broken external server: lists a model, then answers completions as `mode` says.
class Broken(BaseHTTPRequestHandler):
    mode = "http500"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._send(200, "application/json", json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        chunk = 'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
        streams = {"bad_json": chunk + "data: {oops\n\n", "no_choices": chunk + 'data: {"id":"x"}\n\n',
                   "no_done": chunk * 3, "no_tokens": "data: [DONE]\n\n", "short": chunk + "data: [DONE]\n\n",
                   "coalesced": chunk * 3 + 'data: {"choices":[],"usage":{"completion_tokens":8}}\n\ndata: [DONE]\n\n',
                   "closing": chunk * 9 + 'data: {"choices":[],"usage":{"completion_tokens":8}}\n\ndata: [DONE]\n\n',
                   "engine_error": chunk + 'data: {"error":{"message":"out of memory"}}\n\n'}
        if self.mode == "http500":
            self._send(500, "text/plain", b"internal error: the model crashed")
        elif self.mode == "json_not_sse":
            self._send(200, "application/json", b'{"choices":[]}')
        else:
            self._send(200, "text/event-stream", streams[self.mode].encode())

    def _send(self, status, content_type, body):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def level_against(url: str, mode: str, monkeypatch):
    """One level of two clients against the stand-in server answering as `mode` says."""
    monkeypatch.setattr(Broken, "mode", mode)
    client = EndpointServer(url, timeout_s=5)
    try:
        return run_ladder(client, small_workload(), OmegaConf.merge(LOAD, {"concurrency": [2]})).level(2)
    finally:
        client.close()


@pytest.fixture(scope="module")
def broken():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("mode, says", [
    ("http500", "HTTP 500: internal error: the model crashed"),
    ("bad_json", "malformed SSE: a chunk that is not JSON"),
    ("no_choices", "malformed SSE: a chunk without choices"),
    ("no_done", "malformed SSE: the stream ended without data: [DONE]"),
    ("json_not_sse", "malformed SSE: the endpoint answered application/json"),
    ("engine_error", "endpoint error: out of memory"),
    ("no_tokens", "endpoint error: the stream ended with no tokens"),
    ("short", "endpoint error: the stream ended after 1 of the"),   # a cut stream is no fast success
])
def test_a_broken_endpoint_counts_errors_instead_of_crashing(broken, mode, says, monkeypatch):
    level = level_against(broken, mode, monkeypatch)
    assert len(level.records) >= 6 and level.error_rate == 1.0 and level.n_ok == 0
    assert all(r.error.startswith(says) for r in level.records)
    assert level.stats["e2e_ms"] is None


@pytest.mark.parametrize("mode", ["coalesced", "closing"])
def test_the_closing_usage_counts_tokens_a_server_sent_together_or_not_at_all(broken, mode, monkeypatch):
    """vLLM under load sends several tokens in one chunk; llama-server closes with a chunk that has none."""
    level = level_against(broken, mode, monkeypatch)
    assert level.error_rate == 0 and all(len(r.token_times) == 8 for r in level.records)


# --- the CLI ----------------------------------------------------------------------------------------------
def cli(monkeypatch, *argv) -> int:
    from experiments import cli as cli_module

    monkeypatch.setattr("sys.argv", ["roi-ladder", *argv])
    with pytest.raises(SystemExit) as exit_:
        cli_module.main()
    return exit_.value.code


@pytest.mark.parametrize("override, says", [
    ("benchmark.slos=['p99_e2e<=5']", "SLO 'p99_e2e<=5' does not parse"),
    ("benchmark.concurrency=[0,2]", "benchmark.concurrency must list integers >= 1"),
    ("target.workload.prompts=0", "target.workload.prompts=0 is not an integer (or null) >= 1"),
])
def test_bench_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, override, says):
    code = cli(monkeypatch, "bench", "--endpoint", "http://127.0.0.1:9", f"data_dir={tmp_path}", override)
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, says", [
    (["--endpoint", "ftp://127.0.0.1:9"], "endpoint URL 'ftp://127.0.0.1:9' is not an http(s) URL"),
    (["--endpoint", "http://127.0.0.1:9"], "bench --endpoint needs the served model's tokenizer, and target "
                                           "tiny-llm's model is not built here (builtin:tiny-llm)"),
    (["--endpoint", "http://127.0.0.1:9", "--tokenizer", "/"], "--tokenizer / holds no tokenizer"),
    (["--endpoint", "http://127.0.0.1:9", "--tokenizer", "MODEL"], "endpoint http://127.0.0.1:9 is unreachable"),
])
def test_bench_refuses_without_building_a_model(model_dir, monkeypatch, capsys, tmp_path, args, says):
    started = time.monotonic()
    code = cli(monkeypatch, "bench", *[str(model_dir) if a == "MODEL" else a for a in args], f"data_dir={tmp_path}")
    err = capsys.readouterr().err
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "cache").exists() and time.monotonic() - started < 60     # nothing trained first
    assert not (tmp_path / "mlflow.db").exists()                                      # nor recorded


def test_bench_cli_logs_an_endpoint_run(endpoint, model_dir, monkeypatch, capsys, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    url, _ = endpoint
    code = cli(monkeypatch, "bench", "--endpoint", url, "--tokenizer", str(model_dir), f"data_dir={tmp_path}",
               "benchmark.concurrency=[1,2]", "benchmark.warmup_requests=1", "benchmark.min_requests=4",
               "benchmark.min_duration_s=0", "target.workload.prompts=8", "target.workload.output_tokens=[4]")
    out = capsys.readouterr().out
    assert code == 0 and "load (c or rate)" in out and "endpoint-bench" in out
    cfg = compose([f"data_dir={tmp_path}"])
    mlflow.set_tracking_uri(str(cfg.tracking.uri))
    client = MlflowClient()
    run = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id])[0]
    assert run.info.run_name == "endpoint-bench" and run.data.tags["roi.endpoint"] == url
    assert run.data.tags["roi.tokenizer"] == f"{model_dir} (--tokenizer)" and f"tokenizer: {model_dir}" in out
    assert not (tmp_path / "cache").exists()                  # the built-in model was not built for it
    assert [m.step for m in client.get_metric_history(run.info.run_id, "ttft_ms_p50")] == [1, 2]
    assert "client_cpu_percent" in run.data.metrics and "queue_ms_p50" not in run.data.metrics
    assert "benchmark/samples.csv" in [a.path for a in client.list_artifacts(run.info.run_id, "benchmark")]


@pytest.mark.parametrize("own_prompts", [True, False])
def test_bench_takes_a_folder_target_with_or_without_a_prompts_file(endpoint, model_dir, tokenizer, monkeypatch,
                                                                   capsys, tmp_path, own_prompts):
    """A user's folder (target=folder) benched with their own prompts file reaches the endpoint with exactly those
    prompts; without one (prompts: null) with synthetic requests (it read int(None) before)."""
    url, recording = endpoint
    lines = [f"def user_function_{i}(x):" for i in range(6)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t, "max_tokens": 4}) + "\n" for t in lines))
    before = len(recording.records)
    code = cli(monkeypatch, "bench", "--endpoint", url, f"data_dir={tmp_path}", "target=folder",
               f"target.source={model_dir}", "benchmark.concurrency=[1]", "benchmark.warmup_requests=1",
               "benchmark.min_requests=4", "benchmark.min_duration_s=0", "target.workload.output_tokens=[4]",
               *([f"target.workload.prompts={prompts}"] if own_prompts else ["target.workload.requests=8"]))
    out, err = capsys.readouterr()
    assert code == 0 and "endpoint-bench" in out, err
    sent = {tuple(r.prompt.token_ids) for r in recording.records[before:]}
    from_file = {tuple(tokenizer(t)["input_ids"]) for t in lines}
    assert sent and (sent <= from_file if own_prompts else not sent & from_file)


def test_serve_builds_the_named_rungs_on_the_baseline(tmp_path):
    from experiments.climb.endpoint import candidate

    cfg = compose([f"data_dir={tmp_path}", f"cache_dir={SHARED_CACHE}"])
    cand = candidate(cfg, ["onnxruntime", "dynamic_batching"], print)
    assert cand.rungs == ("baseline", "onnxruntime", "dynamic_batching")
    assert (cand.recipe.engine, cand.recipe.batching) == ("onnxruntime", "dynamic")
    with pytest.raises(ConfigError, match="rung 'dynamic_batching' does not apply to baseline"):
        candidate(cfg, ["dynamic_batching"], print)
    with pytest.raises(ConfigError, match="--rungs names warp_drive, not in the configured ladder"):
        candidate(cfg, ["warp_drive"], print)
