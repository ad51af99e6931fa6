"""llama.cpp for real: llama-server (compiled here, ~10 min once per machine) serving SmolLM2 converted to GGUF by
llama.cpp's own converter, as our torch engine computes it; its forced-token scores exact; Q8_0 made from the same
weights; a folder the converter refuses is one clear error; nothing left running.

The compile is too long for CI's budget beside the suite: these tests run where the build is in the engines'
cache (`make llama-cpp` makes it), or with ROI_TEST_LLAMA_CPP=1, which builds it; elsewhere they skip saying so."""
from __future__ import annotations

import json
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


def test_q8_0_is_made_from_the_same_weights_and_stays_close(smollm2, torch_engine, tmp_path):
    engine = build_engine(Candidate(smollm2, Recipe(engine="llama.cpp", quantization="int8")), 2, tmp_path)
    try:
        assert engine.weight_bits() == 8.5 and engine.gguf.stat().st_size < 0.4 * 4 * 134e6
        window = tuple(range(1000, 1040))
        drift = BaselineLogprobs.record(torch_engine, [window]).compare(engine)
        assert drift.kl_mean < 0.05 and np.isfinite(drift.ppl_ratio)
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
