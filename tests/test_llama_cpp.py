"""llama.cpp for real: llama-server (compiled here, ~10 min once per machine) serving SmolLM2 converted to GGUF by
llama.cpp's own converter, as our torch engine computes it; its forced-token scores exact; Q8_0 made from the same
weights; a folder the converter refuses is one clear error; nothing left running.

They run where the build is in the engines' cache (`make llama-cpp` makes it, ~6-10 min once per machine), and
with ROI_TEST_LLAMA_CPP=1, which builds it first: `make test` (and so CI) sets it, so a new machine runs llama.cpp
for real too; elsewhere (a bare pytest, `make test-fast`) they skip saying so."""
from __future__ import annotations

import json
from pathlib import Path
import os
import shutil

import numpy as np
import psutil
import pytest
from conftest import SHARED_CACHE

from experiments.core.recipe import Candidate, Recipe, Target
from experiments.judge.fidelity import BaselineLogprobs
from experiments.serving import build_engine
from experiments.serving.backends.llama_cpp.build import LlamaCppBuild
from experiments.serving.environments import EngineUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not LlamaCppBuild().folder().joinpath("roi-engine.json").is_file() and not os.environ.get("ROI_TEST_LLAMA_CPP"),
    reason="llama.cpp is not built on this machine (make llama-cpp builds it, ~10 min; or ROI_TEST_LLAMA_CPP=1)")]


def our_processes() -> set[int]:
    """This test's descendants, and any llama-server (vLLM's tests may run beside these on the other worker)."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    for proc in psutil.process_iter(["cmdline"]):
        if "llama-server" in " ".join(proc.info["cmdline"] or []):
            mine.add(proc.pid)
    return mine - {p.pid for p in psutil.Process().children(recursive=True)
                   if "vllm" in " ".join(_cmdline(p))}


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


@pytest.fixture(scope="module")
def smollm2():
    from experiments.targets.models import smollm2

    return Target("smollm2", "causal-lm", smollm2.ensure_built(SHARED_CACHE, print))


@pytest.fixture(scope="module")
def torch_engine(smollm2, tmp_path_factory):
    engine = build_engine(Candidate(smollm2), 2, tmp_path_factory.mktemp("art"))
    yield engine
    engine.close()


def test_llama_server_serves_smollm2_as_torch_computes_it(smollm2, torch_engine, tmp_path):
    before = our_processes()
    prompt = torch_engine.tokenizer.encode("The capital of France is", add_special_tokens=False)
    windows = [tuple(torch_engine.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n"
                                                   "    return fibonacci(n - 1) + fibonacci(n - 2)\n" * 2,
                                                   add_special_tokens=False)[:48])]
    baseline = BaselineLogprobs.record(torch_engine, windows)
    engine = build_engine(Candidate(smollm2, Recipe(engine="llama.cpp", batching="continuous", max_batch=2)), 2,
                          tmp_path)
    try:
        assert engine.gguf.is_file() and engine.weight_bits() == 32.0
        assert [t for t, _ in engine.generate(prompt, 6)] == [t for t, _ in torch_engine.generate(prompt, 6)]
        drift = baseline.compare(engine)
        assert drift.kl_mean < 1e-3 and drift.top1_agreement > 0.95 and abs(drift.ppl_ratio - 1) < 0.01
        # a forced token's log-prob is exact: the same continuation scored by torch
        request = [(("", ""), prompt, torch_engine.tokenizer.encode(" Paris.", add_special_tokens=False))]
        ours = torch_engine.lm_eval_model(batch_size=1)._loglikelihood_tokens(request)
        served = engine.lm_eval_model(batch_size=1)._loglikelihood_tokens(request)
        assert served[0][0] == pytest.approx(ours[0][0], abs=0.02) and served[0][1] == ours[0][1]
    finally:
        engine.close()
    assert our_processes() <= before


@pytest.mark.parametrize("quantization, weight_format, size, max_kl", [("int8", "", 0.4, 0.05),
                                                                        ("int4", "Q4_0", 0.25, 0.5)])
def test_quantized_ggufs_are_made_from_the_same_weights_and_stay_close(smollm2, torch_engine, tmp_path,
                                                                       quantization, weight_format, size, max_kl):
    recipe = Recipe(engine="llama.cpp", quantization=quantization, weight_format=weight_format)
    engine = build_engine(Candidate(smollm2, recipe), 2, tmp_path)
    try:
        # Q8_0: 8.5 bits a weight, Q4_0: 4.5 (a scale per block of 32); the fp32 file is 4 x 134 M bytes
        assert engine.gguf.stat().st_size < size * 4 * 134e6
        window = tuple(range(1000, 1040))
        drift = BaselineLogprobs.record(torch_engine, [window]).compare(engine)
        assert drift.kl_mean < max_kl and np.isfinite(drift.ppl_ratio)
    finally:
        engine.close()


def test_a_folder_the_converter_refuses_is_one_error_and_nothing_runs(smollm2, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(smollm2.model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    before = our_processes()
    with pytest.raises(EngineUnavailable, match="convert_hf_to_gguf.py refused") as refused:
        build_engine(Candidate(Target("broken", "causal-lm", broken), Recipe(engine="llama.cpp")), 2, tmp_path / "a")
    assert "NoSuchModelForCausalLM" in str(refused.value)
    assert our_processes() <= before


def prompt_tokens_processed(url: str) -> float:
    """llama-server's count of prompt tokens it computed (a prompt-cache hit computes only what it lacks)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert "llamacpp:prompt_tokens_total" in found, sorted(found)
    return found["llamacpp:prompt_tokens_total"]


def test_the_load_ladder_gives_a_caching_server_nothing_to_read_from_its_cache(smollm2, torch_engine, tmp_path):
    """llama-server as deployed (its prompt cache and host-memory copies on) computes every prompt token of the
    load ladder's requests, as a fresh server per level would: no prompt is sent to it twice (issue 41). The same
    server given a workload that cycles its prompts (as the ladder's did) computes a fraction of them."""
    from omegaconf import OmegaConf

    from experiments.measure.load_ladder import run_ladder
    from experiments.serving.servers import serve
    from experiments.targets.workload import Workload

    tokenizer = torch_engine.tokenizer
    texts = [(p.read_text()) for p in sorted((Path(json.__file__).parent).glob("*.py"))]
    cfg = OmegaConf.create({"concurrency": [1, 2], "warmup_requests": 2, "warmup_s": 0.0, "min_requests": 8,
                            "min_duration_s": 0.0, "max_duration_s": 60.0, "request_timeout_s": 60.0})
    engine = build_engine(Candidate(smollm2, Recipe(engine="llama.cpp", quantization="int8", batching="continuous",
                                                    max_batch=2, prefix_caching=True)), 2, tmp_path)
    try:
        assert "--cache-prompt" in engine.process.command and engine.bounded_cache_mb() == 8192

        def computed_share(workload) -> float:
            sent = []
            server = serve(engine)
            recording = type("Recording", (), {"submit": lambda self, p, intended=None: (
                sent.append(p), server.submit(p, intended))[1]})()
            before = prompt_tokens_processed(engine.url)
            try:
                run_ladder(recording, workload, cfg)
            finally:
                server.close()
            return (prompt_tokens_processed(engine.url) - before) / sum(len(p.token_ids) for p in sent)

        cycled = Workload.from_texts(texts, tokenizer, [32, 48], [2], 3, 2, seed=5)
        assert computed_share(Workload(cycled.prompts, cycled.warmup)) < 0.6     # the cache served the repeats
        assert computed_share(Workload.from_texts(texts, tokenizer, [32, 48], [2], 3, 2, seed=6)) > 0.9
    finally:
        engine.close()


def test_a_draft_model_proposes_tokens_and_the_answer_stays_the_models(smollm2, torch_engine, tmp_path):
    """speculative_draft with a folder as the draft (a Q8_0 made from it): llama-server drafts and verifies, and
    its greedy answer is the one it gives without a draft."""
    prompt = torch_engine.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n", add_special_tokens=False)
    plain = Recipe(engine="llama.cpp", quantization="int8", batching="continuous", max_batch=1)
    answers = []
    for recipe in (plain, Recipe(**{**plain.__dict__, "speculative": "draft",
                                    "draft_model": str(smollm2.model_dir)})):
        engine = build_engine(Candidate(smollm2, recipe), 2, tmp_path)
        try:
            answers.append([t for t, _ in engine.generate(prompt, 12)])
            body = engine._native(prompt, n_predict=12, ignore_eos=True)
            if recipe.speculative == "draft":
                assert engine.draft.is_file() and "--model-draft" in engine.process.command
                assert body["timings"]["draft_n"] > 0 and body["timings"]["draft_n_accepted"] > 0, body["timings"]
        finally:
            engine.close()
    assert answers[0] == answers[1]
