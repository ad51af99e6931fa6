"""The engines as their users start them (optimizers/engine_defaults.py), without a server: the command is the
model and nothing else, any later rung makes it explicit, and the sweep's line on the champion against the best
default that kept the model's answers (experiments/climb/versus_defaults.py)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from experiments.climb import versus_defaults as versus
from experiments.core.recipe import Candidate, Env, Recipe, Target
from experiments.judge.gate import Criterion, Verdict
from experiments.record.outcome import RungOutcome
from experiments.serving.backends.llama_cpp.causal_lm import command as llama_command
from experiments.serving.backends.vllm.causal_lm import command as vllm_command, server_env
from optimizers.engine_defaults import EngineDefaults, is_default
from optimizers.kv_cache_dtype import KvCacheDtype

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
BASE = Candidate(Target("m", "causal-lm", Path("/models/m")), Recipe(), ("baseline",))
CHAMPION = Candidate(BASE.target, Recipe(engine="onnxruntime", quantization="int8"), ("baseline", "onnxruntime",
                                                                                    "int8"))


def test_llama_server_is_started_with_the_model_and_nothing_else():
    rung = EngineDefaults("llama.cpp")
    assert rung.name == "llama_cpp_defaults" and rung.check(CPU, CHAMPION) is None
    cand = rung.apply(CHAMPION)
    # from the target as the user has it, not the champion's recipe: a Q8_0 of its weights, 4 slots, caches on
    assert cand.rungs == ("baseline", "llama_cpp_defaults") and is_default(SimpleNamespace(candidate=cand))
    assert (cand.recipe.engine, cand.recipe.quantization, cand.recipe.max_batch, cand.recipe.prefix_caching) == \
        ("llama.cpp", "int8", 4, True)
    args = llama_command(cand, Path("llama-server"), Path("m.gguf"), 2, 8192)
    assert args == ["llama-server", "-m", "m.gguf", "--alias", "m", "--host", "127.0.0.1", "--port", "{port}",
                    "--metrics"]
    assert "llama-server -m" in rung.decision
    assert rung.check(CPU, cand) == "the champion is llama.cpp with its defaults"


def test_a_rung_after_a_default_makes_its_recipe_explicit():
    default = EngineDefaults("llama.cpp").apply(BASE)
    kv = KvCacheDtype().apply(default)
    assert not kv.recipe.defaults and kv.rungs[-1] == "kv_cache_dtype"
    args = llama_command(kv, Path("llama-server"), Path("m.gguf"), 2, 8192)
    assert args[args.index("--parallel") + 1] == "4" and "--cache-type-k" in args


def test_vllm_is_started_as_vllm_serve_folder():
    cand = EngineDefaults("vllm").apply(CHAMPION)
    assert vllm_command(cand, "py") == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m",
                                        "--served-model-name", "m", "--host", "127.0.0.1", "--port", "{port}"]
    assert server_env(cand) == {} and cand.recipe.precision == "bf16" and cand.recipe.max_batch == 256


def outcome(name, status, tokens_s, cand=None, lost=()):
    criteria = tuple(Criterion(c, c not in lost, c) for c in ("performance", "accuracy:facts", "fidelity"))
    level = SimpleNamespace()
    bench = SimpleNamespace(levels=[level])
    out = RungOutcome(name, Verdict(status, "", criteria), cand or CHAMPION, bench, run_id=name)
    out.summary = lambda top: {"throughput": tokens_s}
    return out


def test_the_best_default_is_the_fastest_that_kept_the_models_answers():
    llama = outcome("llama_cpp_defaults", "accepted", 120, EngineDefaults("llama.cpp").apply(BASE))
    vllm = outcome("vllm_defaults", "rejected", 150, EngineDefaults("vllm").apply(BASE), lost=("fidelity",))
    best, left_out = versus.best_default([outcome("baseline", "accepted", 14, BASE), llama, vllm], 8)
    assert best is llama and left_out == ["vllm_defaults failed fidelity: a reference row only"]


def test_the_line_names_the_champion_against_the_best_default(monkeypatch):
    llama = outcome("llama_cpp_defaults", "accepted", 120, EngineDefaults("llama.cpp").apply(BASE))
    int8 = outcome("int8", "accepted", 160)
    sweep = SimpleNamespace(cfg=SimpleNamespace(gate=SimpleNamespace(confidence=0.95)))
    assert versus.versus_defaults([llama], llama, sweep, 8) == versus.Versus(
        "champion vs best default: the champion is llama_cpp_defaults itself; no rung climbed past it", llama)
    rounds = {"tokens": np.array([1.31, 1.28, 1.35, 1.30, 1.26, 1.33, 1.29, 1.32]),
              "tpot": np.array([0.95, 0.97, 0.93, 0.96, 0.94, 0.98, 0.95, 0.96])}
    monkeypatch.setattr(versus, "_side_by_side", lambda *a: (rounds, 8))
    result = versus.versus_defaults([llama, int8], int8, sweep, 8)
    line = result.line
    assert result.champion is int8 and line.startswith("champion vs best default (llama_cpp_defaults): ×1.30 [") and "tokens/s at c=8" in line
    assert "TPOT ×0.95 [" in line and "(8 interleaved rounds)" in line
    monkeypatch.setattr(versus, "_side_by_side", lambda *a: (rounds, 3))
    assert "undecided, 3 rounds" in versus.versus_defaults([llama, int8], int8, sweep, 8).line
    assert versus.versus_defaults([int8], int8, sweep, 8) == versus.Versus("", int8)   # no default: no line


def test_a_champion_that_serves_surely_less_than_a_default_gives_way_to_it(monkeypatch):
    """ONNX Runtime INT8 passed llama-server's defaults on mean E2E at c=8 in short rounds (0.902 [0.880, 0.925])
    and served 0.88 [0.86, 0.91] of its tokens/s side by side: the sweep ends on the default."""
    llama = outcome("llama_cpp_defaults", "accepted", 75, EngineDefaults("llama.cpp").apply(BASE))
    ort = outcome("onnxruntime", "accepted", 70)
    sweep = SimpleNamespace(cfg=SimpleNamespace(gate=SimpleNamespace(confidence=0.95)))
    slower = {"tokens": np.array([0.88, 0.86, 0.90, 0.87, 0.89, 0.88, 0.91, 0.86]), "tpot": np.full(8, 0.3)}
    monkeypatch.setattr(versus, "_side_by_side", lambda *a: (slower, 8))
    result = versus.versus_defaults([llama, ort], ort, sweep, 8)
    assert result.champion is llama and "which is therefore the champion" in result.line
    tied = {"tokens": np.array([0.95, 1.04, 0.99, 1.02, 0.97, 1.01, 0.98, 1.03]), "tpot": np.full(8, 0.3)}
    monkeypatch.setattr(versus, "_side_by_side", lambda *a: (tied, 8))
    assert versus.versus_defaults([llama, ort], ort, sweep, 8).champion is ort       # not shown slower: it stays
