"""vLLM for real: its CPU build serves the built-in model, in its own environment (made with uv on first use,
~25 s, then reused), as our torch engine computes it, and leaves no process behind; a model it cannot load is
one clear error with its log's last lines. Each server start costs ~30-80 s of vLLM's start-up here."""
from __future__ import annotations

import json
import os
import shutil
import time

import psutil
import pytest
from omegaconf import OmegaConf

from experiments.core.recipe import Candidate, Recipe, Target
from experiments.core.request import Prompt
from experiments.judge.fidelity import BaselineLogprobs
from experiments.serving import build_engine
from experiments.serving.server_process import ServerFailed
from experiments.measure.load import run_level
from experiments.serving.servers import serve
from experiments.targets.workload import Workload

pytestmark = pytest.mark.slow
WORKLOAD = Workload(prompts=tuple(Prompt(i, (10 + i, 20, 30), 6) for i in range(24)),
                    warmup=tuple(Prompt(100 + i, (50 + i, 7), 6) for i in range(2)))
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
            level = run_level(server, WORKLOAD, 4, LOAD, 0.95)
        finally:
            server.close()
        assert level.error_rate == 0 and all(len(r.token_times) == 6 for r in level.records)
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
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in _in_group(server_group))   # nothing of it runs
    deadline = time.monotonic() + 10           # and init reaps the orphans' zombies soon after
    while _in_group(server_group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _in_group(server_group)
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


def _in_group(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                found.append(proc)
        except (OSError, psutil.Error):
            pass
    return found

