"""Serving engines without a server: their environments (made with uv), what they refuse, the command a recipe
becomes, the swap rung, fidelity from a server's top-K log-probs, and the pause hook of the gate's rounds."""
from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.special import log_softmax

from experiments.climb.contender import numerics_key
from experiments.core.recipe import Candidate, Env, Recipe, Target
from experiments.judge.fidelity import TopLogprobs, kl_per_position, predicting
from experiments.serving import engine_class, refusal
from experiments.serving.backends.llama_cpp.causal_lm import command as llama_command
from experiments.serving.backends.llama_cpp.causal_lm import gguf_type
from experiments.serving.backends.vllm.causal_lm import VllmEngine, command
from experiments.serving.environments import EngineEnvironment, EngineUnavailable
from optimizers.engine_defaults import EngineDefaults
from optimizers.half_precision import HalfPrecision
from optimizers.prefix_caching import PrefixCaching
from optimizers.quantization import WeightQuantization
from optimizers.serving_engine import ServingEngineSwap
from optimizers.weight_format import WeightFormat

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
GPU = Env(cuda=True, cuda_capability=(9, 0), cpu_count=16)


def candidate(**recipe) -> Candidate:
    return Candidate(Target("m", "causal-lm", Path("/models/m")), Recipe(**recipe), ("baseline",))


# --- environments -----------------------------------------------------------------------------------------
def test_an_environment_is_made_once_and_reused(tmp_path):
    env = EngineEnvironment("probe", "1", "cpu", ("six",), check="six")
    notes = []
    python = env.ensure(tmp_path, notes.append)
    assert python.is_file() and env.ready(tmp_path) and "six" in env.installed(tmp_path).lower()
    assert len(notes) == 1 and "once per machine" in notes[0]
    assert env.ensure(tmp_path, notes.append) == python and len(notes) == 1      # reused, not rebuilt
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [env.name]     # no partial folder left


@pytest.mark.parametrize("requirements, check, says", [
    (("roi-ladder-no-such-package==9.9.9",), "six", "uv pip install ... exited with code"),
    (("six",), "no_such_module", "`import no_such_module` fails in it"),
])
def test_an_environment_that_cannot_be_made_is_one_clear_error_and_leaves_nothing(tmp_path, requirements, check,
                                                                                  says):
    env = EngineEnvironment("probe", "1", "cpu", requirements, check=check)
    with pytest.raises(EngineUnavailable, match="could not make the probe 1 environment for cpu") as error:
        env.ensure(tmp_path, lambda _: None)
    assert says in str(error.value) and "the last lines of" in str(error.value)
    assert not env.ready(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]       # neither the folder nor a .partial-* one


def test_environments_live_outside_the_checkout(monkeypatch, tmp_path):
    from experiments.serving.environments import engines_home

    monkeypatch.delenv("ROI_ENGINES_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert engines_home() == tmp_path / "roi-ladder" / "engines"
    monkeypatch.setenv("ROI_ENGINES_HOME", "/somewhere/else")
    assert engines_home() == Path("/somewhere/else")


# --- what vLLM builds, and how --------------------------------------------------------------------------
def test_the_vllm_engine_is_found_by_its_recipe():
    assert engine_class(candidate(engine="vllm")) is VllmEngine


@pytest.mark.parametrize("recipe, says", [
    (dict(precision="fp16"), "vLLM's CPU backend runs fp32 or bf16"),
    (dict(quantization="int8"), "vLLM quantizes to fp8 on a GPU here"),
    (dict(quantization="fp8"), "vLLM quantizes to fp8 on a GPU here"),
    (dict(batching="static", max_batch=4), "vLLM batches continuously"),
    (dict(cuda_graph=True), "CUDA graphs on a GPU only"),
    (dict(compile="inductor"), "torch.compile compiles the torch engine"),
])
def test_vllm_refuses_what_it_cannot_run_with_the_reason(recipe, says):
    assert says in refusal(candidate(engine="vllm", **recipe))


def test_vllm_takes_what_it_can_run():
    for recipe in (dict(), dict(precision="bf16"), dict(batching="continuous", max_batch=8, prefix_caching=True),
                   dict(execution_provider="cuda", precision="fp16", quantization="fp8", cuda_graph=True)):
        assert refusal(candidate(engine="vllm", **recipe)) is None, recipe


def flags(args: list[str]) -> dict:
    return {a: (b if not b.startswith("--") else None) for a, b in zip(args, args[1:] + ["--"]) if a.startswith("--")}


def test_the_recipe_becomes_vllms_own_flags():
    plain = flags(command(candidate(engine="vllm"), "py"))
    assert plain["--dtype"] == "float32" and plain["--max-num-seqs"] == "1" and plain["--port"] == "{port}"
    assert "--enforce-eager" in plain and "--no-enable-prefix-caching" in plain   # vLLM caches prefixes by default
    assert plain["--host"] == "127.0.0.1"
    tuned = flags(command(candidate(engine="vllm", precision="bf16", batching="continuous", max_batch=16,
                                    max_tokens_per_step=512, prefix_caching=True), "py"))
    assert tuned["--dtype"] == "bfloat16" and tuned["--max-num-seqs"] == "16"
    assert tuned["--max-num-batched-tokens"] == "512" and "--enable-prefix-caching" in tuned
    gpu = flags(command(candidate(engine="vllm", execution_provider="cuda", cuda_graph=True, quantization="fp8",
                                  precision="bf16"), "py"))
    assert "--enforce-eager" not in gpu and gpu["--quantization"] == "fp8"


# --- the rungs on a vLLM champion ---------------------------------------------------------------------------
def test_the_swap_serves_the_champions_precision_with_continuous_batching():
    swap = ServingEngineSwap("vllm", max_num_seqs=16)
    ort = candidate(engine="onnxruntime", precision="fp32")
    assert swap.check(CPU, ort) is None
    served = swap.apply(ort).recipe
    # its prefix cache on, as vLLM starts (the load sends no prompt twice, so it cannot flatter it)
    assert (served.engine, served.precision, served.batching, served.max_batch, served.prefix_caching) == \
        ("vllm", "fp32", "continuous", 16, True)
    assert "already runs in vllm" in swap.check(CPU, swap.apply(ort))
    # an int8 champion: vLLM's CPU build cannot quantize, so it enters with the unquantized weights, saying so
    assert swap.check(CPU, candidate(engine="onnxruntime", quantization="int8")) is None
    assert "vLLM quantizes to fp8 on a GPU here" in swap.decision
    assert swap.apply(candidate(engine="onnxruntime", quantization="int8")).recipe.quantization == "none"
    q8 = ServingEngineSwap("llama.cpp").apply(candidate(engine="onnxruntime", quantization="int8"))
    assert ServingEngineSwap("llama.cpp").check(CPU, candidate(engine="onnxruntime", quantization="int8")) is None
    assert q8.recipe.quantization == "int8"                                  # served as Q8_0
    with pytest.raises(ValueError, match="engine must be one of"):
        ServingEngineSwap("tgi")


def test_later_rungs_apply_to_vllm_where_it_can_and_say_why_not_where_it_cannot():
    served = ServingEngineSwap("vllm").apply(candidate())
    assert HalfPrecision().check(CPU, served) is None
    assert PrefixCaching().check(CPU, served) == "the champion already caches prefixes"     # as deployed
    assert PrefixCaching().check(CPU, replace(served, recipe=replace(served.recipe, prefix_caching=False))) is None
    assert "vLLM quantizes to fp8 on a GPU" in WeightQuantization("int8").check(CPU, served)


# --- fidelity from a server's top-K log-probs -------------------------------------------------------------
def top_k_of(dense: np.ndarray, tokens: list[int], k: int) -> TopLogprobs:
    ids = np.argsort(-dense, axis=-1)[:, :k]
    followed_ids = np.array(tokens[1:] + [-1])
    followed = np.array([dense[t, i] if i >= 0 else np.nan for t, i in enumerate(followed_ids)])
    return TopLogprobs(ids, np.take_along_axis(dense, ids, -1), followed, followed_ids)


def test_top_k_kl_is_a_lower_bound_that_is_exact_with_the_whole_vocabulary():
    rng = np.random.default_rng(0)
    base = log_softmax(rng.normal(size=(6, 50)) * 2, axis=-1)
    cand = log_softmax(np.log(np.exp(base) + 0.01 * rng.random((6, 50))), axis=-1)
    tokens = [int(t) for t in rng.integers(0, 50, 6)]
    full = kl_per_position(base, cand)
    assert np.allclose(kl_per_position(base, top_k_of(cand, tokens, 50)), full)
    few = kl_per_position(base, top_k_of(cand, tokens, 5))
    assert (few <= full + 1e-12).all() and (few > 0).all()
    assert (top_k_of(cand, tokens, 5).argmax(-1) == cand.argmax(-1)).all()


def test_a_top_k_scorer_is_given_the_whole_sequence_and_a_full_one_all_but_its_last_token():
    seen = []

    def full(tokens):
        seen.append(list(tokens))
        return np.zeros((len(tokens), 3))

    class TopK:
        top_k = 2

        def __call__(self, tokens):
            seen.append(list(tokens))
            return top_k_of(np.zeros((len(tokens), 3)), list(tokens), 2)

    assert predicting(full, [0, 1, 2]).shape == (2, 3)
    assert len(predicting(TopK(), [0, 1, 2])) == 2
    assert seen == [[0, 1], [0, 1, 2]]


# --- the gate's rounds pause a resident server -------------------------------------------------------------
class Pausable:
    def __init__(self):
        self.events = []

    def pause(self):
        self.events.append("pause")

    def resume(self):
        self.events.append("resume")


def _events(built: Pausable) -> list:
    return list(built.events)


def test_a_resident_pauses_what_it_built_between_calls(tmp_path):
    from experiments.measure import isolation

    limits = isolation.Limits(time_s=60, memory_bytes=4 * 2**30, poll_s=0.1)
    with isolation.Resident(Pausable, limits, tmp_path / "resident.log") as resident:
        first = resident.call(_events)
        second = resident.call(_events)
    assert first == ["pause", "resume"] and second == ["pause", "resume", "pause", "resume"]
    assert os.getpid()      # the calls ran in the child; this process built nothing


# --- a server's own metrics ---------------------------------------------------------------------------------
VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} %d
vllm:num_preemptions_created{engine="0",model_name="m"} 1.79e+09
"""


def test_a_servers_metrics_are_read_and_summarized_per_level(monkeypatch):
    from experiments.serving import server_metrics

    pages = iter([VLLM_METRICS % 2, VLLM_METRICS % 5])

    class Page:
        def __init__(self, *_, **__):
            self.text = next(pages).encode()

        def read(self):
            return self.text

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(server_metrics._OPENER, "open", Page)
    samples = [server_metrics.scrape("http://x", server_metrics.VLLM) for _ in range(2)]
    assert samples[0] == {"running": 3.0, "waiting": 1.0, "kv_cache_usage": 0.25, "preemptions": 2.0}
    summary = server_metrics.summarize(samples + [{"running": 1.0}])
    assert summary["running_mean"] == pytest.approx(7 / 3) and summary["running_max"] == 3.0
    assert summary["kv_cache_usage_max"] == 0.25 and summary["preemptions"] == 3.0
    assert summary["in_flight_max"] == 4.0        # running + waiting in one scrape


def test_the_sampler_counts_the_servers_processes_not_this_one(tmp_path):
    import subprocess
    import sys
    import time

    from experiments.measure.resources import ResourceSampler

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with ResourceSampler(0.1, processes=lambda: [busy.pid]) as sampler:
            time.sleep(1.0)          # this process sleeps; the "server" spins a core
    finally:
        busy.kill()
        busy.wait()
    assert sampler.summary()["cpu_percent_mean"] > 50 and sampler.summary()["server_metrics"] is None


# --- llama.cpp --------------------------------------------------------------------------------------------
def test_llama_cpp_runs_gguf_types_made_from_the_recipe_and_refuses_the_rest():
    from experiments.serving.backends.llama_cpp.causal_lm import LlamaCppEngine, gguf_type

    assert engine_class(candidate(engine="llama.cpp")) is LlamaCppEngine
    assert [gguf_type(Recipe(precision=p, quantization=q)) for p, q in
            (("fp32", "none"), ("bf16", "none"), ("fp32", "int8"), ("fp32", "int4"))] == ["f32", "bf16", "Q8_0", "Q4_K_M"]
    assert refusal(candidate(engine="llama.cpp", batching="continuous", max_batch=8)) is None
    assert "built here for the CPU" in refusal(candidate(engine="llama.cpp", execution_provider="cuda"))
    assert "no GGUF type" in refusal(candidate(engine="llama.cpp", quantization="fp8"))
    assert "slots" in refusal(candidate(engine="llama.cpp", batching="dynamic", max_batch=4))


def test_the_llama_cpp_swap_and_its_quantization_rungs():
    swap = ServingEngineSwap("llama.cpp", max_num_seqs=8)
    assert swap.name == "llama_cpp" and swap.check(CPU, candidate(engine="onnxruntime")) is None
    served = swap.apply(candidate(engine="onnxruntime"))
    assert (served.recipe.engine, served.recipe.max_batch) == ("llama.cpp", 8)
    assert WeightQuantization("int8").check(CPU, served) is None        # Q8_0 by llama-quantize
    assert WeightQuantization("int4").check(CPU, served) is None        # Q4_K_M
    assert "already runs in llama.cpp" in swap.check(CPU, served)


def test_repacked_4bit_formats_are_llama_cpps_own_and_made_from_any_llama_cpp_champion():
    defaults = EngineDefaults("llama.cpp").apply(candidate())               # Q8_0, as its users start it
    q4_0, iq4_nl = WeightFormat("Q4_0"), WeightFormat("IQ4_NL")
    assert (q4_0.name, iq4_nl.name) == ("q4_0", "iq4_nl")
    assert q4_0.check(CPU, defaults) is None and iq4_nl.check(CPU, defaults) is None
    made = q4_0.apply(defaults)
    assert gguf_type(made.recipe) == "Q4_0" and made.recipe.quantization == "int4" and not made.recipe.defaults
    assert gguf_type(iq4_nl.apply(made).recipe) == "IQ4_NL"
    assert q4_0.check(CPU, made) == "the champion's weights are already Q4_0"
    assert gguf_type(Recipe(quantization="int8", weight_format="Q4_0")) is None   # a format is one quantization's
    assert "serves no Q4_0 weights" in q4_0.check(CPU, candidate(engine="onnxruntime"))
    assert "serves no Q4_0 weights" in q4_0.check(CPU, ServingEngineSwap("vllm").apply(candidate()))
    with pytest.raises(ValueError, match="format must be one of"):
        WeightFormat("Q5_K")
    # each format's accuracy and fidelity are its own: the score cache keeps them apart (a sweep once gave IQ4_NL
    # Q4_0's scores), and a KV cache in q8_0 apart from the champion's
    assert numerics_key(made) != numerics_key(iq4_nl.apply(made))
    assert numerics_key(defaults) != numerics_key(defaults.edited("kv_cache_dtype", kv_cache_dtype="int8"))


@pytest.mark.parametrize("engine, says", [("sglang", "SGLang serves on a CUDA device"),
                                          ("tensorrt-llm", "TensorRT-LLM serves on a CUDA device only")])
def test_gpu_only_serving_engines_are_skipped_on_a_cpu_champion_with_the_reason(engine, says):
    swap = ServingEngineSwap(engine)
    assert says in swap.check(CPU, candidate(engine="onnxruntime"))
    on_gpu = candidate(engine="torch", execution_provider="cuda", precision="bf16")
    assert swap.check(GPU, on_gpu) is None and swap.apply(on_gpu).recipe.engine == engine


# --- serving engines' own settings: KV-cache type, n-gram speculation, parallelism -----------------------------
def test_kv_cache_type_and_ngram_speculation_become_each_engines_flags():
    from experiments.serving.backends.llama_cpp.causal_lm import command as llama_command
    from optimizers.kv_cache_dtype import KvCacheDtype
    from optimizers.speculative import NgramSpeculation

    llama = ServingEngineSwap("llama.cpp").apply(candidate())
    kv, spec = KvCacheDtype(), NgramSpeculation()
    assert kv.check(CPU, llama) is None and spec.check(CPU, llama) is None
    args = llama_command(spec.apply(kv.apply(llama)), Path("llama-server"), Path("m.gguf"), 2, 8192)
    assert flags(args)["--cache-type-k"] == "q8_0" and flags(args)["--flash-attn"] == "on"
    assert flags(args)["--spec-type"] == "ngram-simple" and args[args.index("-c") + 1] == str(2048 * 16)
    # the prompt cache as llama-server starts, its host-memory copies at their default cap, stated (the soak
    # judges its growth against it); off only where a recipe turns prefix caching off
    assert llama.recipe.prefix_caching and "--cache-prompt" in args and flags(args)["--cache-ram"] == "8192"
    off = llama_command(replace(llama, recipe=replace(llama.recipe, prefix_caching=False)), Path("llama-server"),
                        Path("m.gguf"), 2, 8192)
    assert "--no-cache-prompt" in off and flags(off)["--cache-ram"] == "0"
    served = ServingEngineSwap("vllm").apply(candidate())
    assert "fp8 on a GPU here" in kv.check(CPU, served)                   # vLLM on CPU: no fp8 KV cache
    speculative = flags(command(spec.apply(served), "py"))
    assert '"method": "ngram"' in speculative["--speculative-config"]
    on_gpu = ServingEngineSwap("vllm").apply(candidate(execution_provider="cuda", precision="bf16"))
    assert flags(command(kv.apply(on_gpu), "py"))["--kv-cache-dtype"] == "fp8"
    for in_process in (candidate(), candidate(engine="onnxruntime")):     # in process: skipped, saying why
        assert "a serving engine's setting" in kv.check(CPU, in_process)
        assert "a serving engine's setting" in spec.check(CPU, in_process)


def test_parallel_sizes_reach_vllm_and_the_capacity_plan_counts_devices():
    from omegaconf import OmegaConf

    from experiments.analyse.capacity import plan
    from experiments.serving.backends.vllm.causal_lm import server_env

    swap = ServingEngineSwap("vllm", tensor_parallel=2, pipeline_parallel=2)
    assert "needs 2 CUDA devices on this node; it has 1" in swap.check(GPU, candidate(execution_provider="cuda"))
    four = Env(cuda=True, cuda_capability=(9, 0), cpu_count=64, cuda_device_count=4)
    cand = swap.apply(candidate(execution_provider="cuda", precision="bf16"))
    assert swap.check(four, candidate(execution_provider="cuda", precision="bf16")) is None
    args = flags(command(cand, "py"))
    assert args["--tensor-parallel-size"] == "2" and args["--pipeline-parallel-size"] == "2"
    assert args["--distributed-executor-backend"] == "ray"
    assert server_env(cand)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "split a model across GPUs" in refusal(ServingEngineSwap("vllm", tensor_parallel=2).apply(candidate()))

    class Level:
        concurrency, n_ok, qps = 4, 10, 10.0

        def values(self, metric):
            return np.array([400.0] * 10) if metric == "e2e_ms" else np.array([16.0] * 10)

    bench = type("Bench", (), {"levels": [Level()]})
    cfg = OmegaConf.load(Path(__file__).parents[1] / "conf" / "capacity" / "default.yaml")
    cfg.sla_tier = "offline"
    one, four_devices = plan(bench, cfg), plan(bench, cfg, devices_per_replica=4)
    assert four_devices.replicas == one.replicas and four_devices.devices == 4 * one.replicas
    assert four_devices.cost_per_hour == pytest.approx(4 * one.cost_per_hour)


def test_a_folder_with_tokens_beyond_its_embedding_is_refused_by_llama_cpp_naming_them(tmp_path):
    """transformers' GGUF loader writes tokenizers listing added tokens past the embedding; llama.cpp's converter
    asserts on them, and the rung failed as 'EngineUnavailable: AssertionError'. Now the swap says why, before any
    build or conversion."""
    import json

    from experiments.serving.backends.llama_cpp.build import tokens_beyond_embedding

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 4, "architectures": ["LlamaForCausalLM"]}))
    tokenizer = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "<s>": 3}},
                 "added_tokens": [{"id": 3, "content": "<s>"}, {"id": 4, "content": "<extra_0>"},
                                  {"id": 5, "content": "<extra_1>"}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert tokens_beyond_embedding(tmp_path) == [(4, "<extra_0>"), (5, "<extra_1>")]
    cand = Candidate(Target("m", "causal-lm", tmp_path), Recipe(engine="onnxruntime"), ("baseline",))
    reason = ServingEngineSwap("llama.cpp").check(CPU, cand)
    assert "2 token(s) beyond the model's embedding (ids >= vocab_size 4: 4 '<extra_0>', 5 '<extra_1>')" in reason
    assert "convert_hf_to_gguf.py refuses" in reason
    tokenizer["added_tokens"] = tokenizer["added_tokens"][:1]
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert tokens_beyond_embedding(tmp_path) == [] and ServingEngineSwap("llama.cpp").check(CPU, cand) is None


def test_a_failures_one_line_reason_keeps_what_failed_and_the_cause_not_only_a_class():
    from experiments.core.errors import exception_line

    build = EngineUnavailable("could not make the q8_0 GGUF of m: llama.cpp's convert_hf_to_gguf.py refused /m; the "
                              "last lines of /log:\n  File \"convert_hf_to_gguf.py\", line 9\n  AssertionError")
    line = exception_line(build)
    assert line.startswith("EngineUnavailable: could not make the q8_0 GGUF of m: llama.cpp's convert_hf_to_gguf.py "
                           "refused /m") and line.endswith(" … AssertionError")
    assert exception_line(ValueError("one line")) == "ValueError: one line"
    assert exception_line(AssertionError()) == "AssertionError"


def test_swaps_after_a_llama_cpp_default_champion_enter_where_they_can_run():
    """A serving ladder's first champion may be llama-server with its defaults (a Q8_0, 4 slots, its prompt cache):
    ONNX Runtime then starts from an in-process recipe at that precision (it refused the server's prefix cache),
    and vLLM, which cannot serve int8 on a CPU, enters with the unquantized weights, saying so."""
    from optimizers.engine_defaults import EngineDefaults
    from optimizers.onnxruntime_engine import OnnxRuntimeSwap

    default = EngineDefaults("llama.cpp").apply(candidate())
    ort = OnnxRuntimeSwap()
    assert ort.check(CPU, default) is None
    r = ort.apply(default).recipe
    assert (r.engine, r.quantization, r.batching, r.max_batch, r.prefix_caching, r.defaults) == \
        ("onnxruntime", "int8", "none", 1, False, False)
    vllm = ServingEngineSwap("vllm", max_num_seqs=16)
    assert vllm.check(CPU, default) is None
    assert vllm.apply(default).recipe.quantization == "none"
    assert "vLLM quantizes to fp8 on a GPU here" in vllm.decision and "unquantized weights at fp32" in vllm.decision
    assert "fp8 on a GPU" in refusal(candidate(engine="vllm", quantization="int8"))      # the refusal stands alone


@pytest.mark.parametrize("ladder", ["serving", "serving-quantized"])
def test_the_serving_ladders_batch_an_in_process_champion_and_leave_a_servers_batch_to_server_batching(ladder):
    """ONNX Runtime serves one request at a time unless a batching rung says otherwise: the serving ladders try its
    batching after the engine swaps; a served champion already batches continuously, its batch sized by
    server_batching."""
    from conftest import compose
    from hydra.utils import instantiate

    from optimizers.onnxruntime_engine import OnnxRuntimeSwap

    rungs = list(compose([f"ladder={ladder}"]).ladder.rungs.items())
    names = [n for n, _ in rungs]
    batching = ["static_batching", "dynamic_batching", "continuous_batching"]
    assert names.index("llama_cpp") < names.index("static_batching") and \
        names[names.index("static_batching"):names.index("server_batching")] == batching
    default = EngineDefaults("llama.cpp").apply(candidate())
    in_process = OnnxRuntimeSwap().apply(default)
    for name, rung in rungs:
        if name in batching:
            rung = instantiate(rung)
            assert "already uses continuous batching" in rung.check(CPU, default)
            assert rung.check(CPU, in_process) is None
            assert rung.apply(in_process).recipe.batching == name.split("_")[0]


def test_compute_threads_keep_a_core_for_the_rest_of_the_server():
    """llama-server decodes on all the sweep's threads but one and processes prompts on all; an in-process
    engine is built with one fewer; vLLM binds its own threads; one core leaves none to spare."""
    from optimizers.compute_threads import ComputeThreads
    from optimizers.onnxruntime_engine import OnnxRuntimeSwap

    rung = ComputeThreads()
    llama = ServingEngineSwap("llama.cpp", max_num_seqs=4).apply(candidate(quantization="int8"))
    assert rung.check(CPU, llama) is None
    args = llama_command(rung.apply(llama), Path("llama-server"), Path("m.gguf"), threads=2, model_context=2048)
    assert args[args.index("--threads") + 1] == "1" and args[args.index("--threads-batch") + 1] == "2"
    untouched = llama_command(llama, Path("llama-server"), Path("m.gguf"), threads=2, model_context=2048)
    assert untouched[untouched.index("--threads") + 1] == "2" and "--threads-batch" not in untouched
    in_process = rung.apply(OnnxRuntimeSwap().apply(candidate()))
    assert rung.check(CPU, OnnxRuntimeSwap().apply(candidate())) is None
    assert engine_class(in_process).compute_threads(in_process.recipe, 2) == 1
    assert engine_class(in_process).compute_threads(replace(in_process.recipe, threads=0), 2) == 2
    assert "keeps a core for its scheduler" in rung.check(CPU, candidate(engine="vllm"))
    assert "none to spare" in rung.check(replace(CPU, cpu_count=1), llama)
    assert "already set" in rung.check(CPU, rung.apply(llama))


def test_a_draft_model_is_llama_servers_model_draft_and_skips_without_one(tmp_path):
    from experiments.climb.validation import rung_from
    from experiments.core.errors import ConfigError
    from omegaconf import OmegaConf
    from optimizers.speculative_draft import DraftSpeculation

    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    llama = ServingEngineSwap("llama.cpp", max_num_seqs=4).apply(candidate(quantization="int8"))
    assert "no draft model named" in DraftSpeculation().check(CPU, llama)
    rung = DraftSpeculation(str(draft))
    assert rung.check(CPU, llama) is None
    args = llama_command(rung.apply(llama), Path("llama-server"), Path("m.gguf"), 2, 2048, draft)
    assert args[args.index("--model-draft") + 1] == str(draft) and args[args.index("--spec-type") + 1] == "draft-simple"
    assert "already decodes speculatively (draft)" in rung.check(CPU, rung.apply(llama))
    assert "serving engine's setting" in rung.check(CPU, candidate(engine="onnxruntime"))
    assert "n-gram lookup, not draft" in rung.check(CPU, candidate(engine="vllm"))
    with pytest.raises(ConfigError, match=r"could not be built.*draft_model /nowhere does not exist"):
        rung_from("speculative_draft", OmegaConf.create({"_target_": "optimizers.speculative_draft.DraftSpeculation",
                                                         "draft_model": "/nowhere"}))


def test_llama_cpp_unbuilt_without_its_tools_is_refused_before_any_work(monkeypatch, tmp_path):
    """Where llama.cpp is not built and cmake, ninja or a compiler is missing, every llama.cpp rung skips (a
    required one stops the sweep first: machine_check) naming what to install, and no build starts."""
    import shutil as shutil_module

    from experiments.serving.backends.llama_cpp.build import LlamaCppBuild

    monkeypatch.setenv("ROI_ENGINES_HOME", str(tmp_path))      # nothing built here
    monkeypatch.setattr(shutil_module, "which", lambda name: None if name in ("ninja", "c++", "g++", "clang++")
                        else f"/usr/bin/{name}")
    says = "compiling it needs ninja, a C++ compiler, not found on the PATH"
    assert says in LlamaCppBuild().unbuildable()
    assert says in ServingEngineSwap("llama.cpp").machine_check(CPU)
    assert says in refusal(candidate(engine="llama.cpp", quantization="int8"))
    with pytest.raises(EngineUnavailable, match=re.escape(says)):
        LlamaCppBuild().ensure()
    assert not list(tmp_path.iterdir())
    assert ServingEngineSwap("vllm").machine_check(CPU) is None
