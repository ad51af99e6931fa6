from pathlib import Path

import pytest
from conftest import compose
from hydra.errors import ConfigCompositionException

from experiments.climb.validation import load_rungs, validate
from experiments.core.errors import ConfigError
from experiments.core.recipe import Candidate, Env, Recipe, Target
from optimizers.base import Optimizer
from optimizers.baseline import EagerBaseline
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.quantization import WeightQuantization

LADDER = ["baseline", "torch_compile", "onnxruntime", "openvino", "tensorrt", "static_batching", "dynamic_batching",
          "continuous_batching", "cuda_graph", "half_precision", "int8", "int4", "fp8", "prefix_caching", "distillation"]
CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
GPU = Env(cuda=True, cuda_capability=(9, 0), cpu_count=16)
TARGET = Target("t", "causal-lm", Path("/nonexistent"))


@pytest.mark.parametrize("profile", ["quick", "demo", "production"])
def test_every_profile_composes(profile, tmp_path):
    cfg = compose([f"profile={profile}", f"data_dir={tmp_path}"])
    assert cfg.profile_name == profile
    assert list(cfg.ladder.rungs) == LADDER
    assert cfg.tracking.uri == f"sqlite:///{tmp_path}/mlflow.db"


LADDERS = {"serving-quantized": ["baseline", "llama_cpp_defaults", "vllm_defaults", "onnxruntime", "vllm", "int8",
                                  "int4", "llama_cpp", "static_batching", "dynamic_batching", "continuous_batching",
                                  "server_batching", "compute_threads", "q4_0", "iq4_nl", "kv_cache_dtype",
                                  "speculative_ngram", "speculative_draft"],
           "llama-cpp": ["baseline", "llama_cpp_defaults", "llama_cpp", "server_batching", "compute_threads", "int8",
                         "int4", "q4_0", "iq4_nl", "kv_cache_dtype", "speculative_ngram", "speculative_draft",
                         "prefix_caching"],
           "vllm": ["baseline", "vllm_defaults", "vllm", "server_batching", "half_precision", "cuda_graph", "fp8",
                    "speculative_ngram", "kv_cache_dtype", "prefix_caching"]}


@pytest.mark.parametrize("ladder", sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "ladder").glob("*.yaml")))
def test_every_ladder_composes_and_builds_its_rungs_in_order(ladder, tmp_path):
    cfg = compose([f"ladder={ladder}", f"data_dir={tmp_path}"])
    names = [name for name, _ in load_rungs(cfg)]
    assert names[0] == "baseline" and names == list(cfg.ladder.rungs)
    assert names == LADDERS.get(ladder, names)
    assert set(cfg.ladder.required) <= set(names)


def test_smollm2_brings_its_own_profile_and_the_command_line_still_wins(tmp_path):
    # `make sweep target=smollm2` must run what docs/results.md measured: profile=smollm2, not the tiny model's demo
    cfg = compose(["target=smollm2", f"data_dir={tmp_path}"])
    assert cfg.profile_name == "smollm2"
    assert list(cfg.benchmark.concurrency) == [1, 4, 8]
    explicit = compose(["target=smollm2", "profile=smollm2", f"data_dir={tmp_path}"])
    assert {k: cfg[k] for k in cfg if k != "hydra"} == {k: explicit[k] for k in explicit if k != "hydra"}
    assert compose(["target=smollm2", "profile=quick", f"data_dir={tmp_path}"]).profile_name == "quick"
    assert compose([f"data_dir={tmp_path}"]).profile_name == "demo"


def test_production_profile_has_the_seeds_numbers(tmp_path):
    cfg = compose(["profile=production", f"data_dir={tmp_path}"])
    assert list(cfg.benchmark.concurrency) == [1, 2, 4, 8, 16, 32, 64]
    assert 180 <= cfg.benchmark.warmup_s <= 300
    assert cfg.benchmark.min_requests >= 459


def test_composition_error_names_the_bad_key():
    with pytest.raises(ConfigCompositionException, match="benchmark.no_such_key"):
        compose(["benchmark.no_such_key=1"])


def test_rungs_are_instantiated_from_yaml_in_roi_order(tmp_path):
    rungs = load_rungs(compose([f"data_dir={tmp_path}"]))
    assert [name for name, _ in rungs] == LADDER
    assert isinstance(rungs[0][1], EagerBaseline) and isinstance(rungs[2][1], OnnxRuntimeSwap)
    assert [o.kind for _, o in rungs[5:8]] == ["static", "dynamic", "continuous"]
    assert [o.scheme for _, o in rungs[10:13] if isinstance(o, WeightQuantization)] == ["int8", "int4", "fp8"]
    assert all(isinstance(o, Optimizer) for _, o in rungs)


def test_rung_config_with_unknown_key_is_one_clear_error(tmp_path):
    cfg = compose([f"data_dir={tmp_path}", "+ladder.rungs.onnxruntime.bogus=1"])
    with pytest.raises(ConfigError, match="rung 'onnxruntime' could not be built.*bogus"):
        load_rungs(cfg)


@pytest.mark.parametrize("override,message", [
    ("benchmark.concurrency=[0,2]", "benchmark.concurrency must list integers >= 1"),
    ("benchmark.concurrency=[-1]", "benchmark.concurrency must list integers >= 1"),
    ("gate.objective.metric=speed", "gate.objective.metric 'speed' is unknown"),
    ("gate.objective.concurrency=3", "is not a measured level"),
    ("target.source=/no/such/model", "does not exist"),
    ("target.source=builtin:nope", "unknown built-in target"),
    ("target.source=meta-llama/Llama-3-8B", "looks like a hub id"),
])
def test_bad_input_is_refused_before_work_starts(override, message, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=message):
        validate(compose([f"data_dir={tmp_path}", override]))


def test_model_folder_without_weights_is_refused(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="lacks .*safetensors.*tokenizer"):
        validate(compose([f"data_dir={tmp_path}", f"target.source={tmp_path / 'model'}"]))


def test_unwritable_data_dir_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="not writable"):
        validate(compose([f"data_dir={blocker}/sub"]))


def test_apply_returns_a_new_candidate_and_leaves_the_champion_alone():
    champion = EagerBaseline().apply(Candidate(TARGET))
    challenger = OnnxRuntimeSwap().apply(champion)
    assert champion.recipe == Recipe()                       # unchanged: a rejected rung reverts for free
    assert challenger.recipe.engine == "onnxruntime" and challenger.rungs == ("baseline", "onnxruntime")
    assert WeightQuantization("int8").apply(challenger).recipe.quantization == "int8"


def test_check_says_why_a_rung_does_not_apply():
    ort = OnnxRuntimeSwap().apply(Candidate(TARGET))
    assert "already runs in ONNX Runtime" in OnnxRuntimeSwap().check(CPU, ort)
    assert "already quantized" in WeightQuantization("int8").check(CPU, WeightQuantization("int8").apply(ort))
    assert WeightQuantization("int8").check(CPU, ort) is None
    embedding = Candidate(Target("m", "embedding", Path("/x")))
    assert OnnxRuntimeSwap().check(CPU, embedding) is None     # the encoder's own ONNX Runtime engine


def test_cuda_provider_is_selected_only_with_a_cuda_device():
    cuda_swap = OnnxRuntimeSwap(execution_provider="cuda")
    assert "no CUDA device" in cuda_swap.check(CPU, Candidate(TARGET))
    assert "does not move the model" in cuda_swap.check(GPU, Candidate(TARGET))   # a CPU champion
    assert cuda_swap.check(GPU, Candidate(TARGET, Recipe(execution_provider="cuda"))) is None
    with pytest.raises(ValueError, match="execution_provider"):
        OnnxRuntimeSwap(execution_provider="tpu")
