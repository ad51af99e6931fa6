"""The device is the recipe's from the start (`target.device`), on a pretend-CUDA Env: the baseline runs eager on
the GPU at the checkpoint's dtype, and no rung moves the model to another device along with its technique."""
import json
from pathlib import Path

import pytest

from experiments.core.recipe import Candidate, Env, Recipe, Target, device_name
from optimizers.baseline import EagerBaseline
from optimizers.cuda_graph import CudaGraph
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.openvino_engine import OpenVinoSwap
from optimizers.placement import placed, resolve_device
from optimizers.tensorrt import TensorRT
from tests.conftest import compose

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
TWO_H100 = Env(cuda=True, cuda_capability=(9, 0), cpu_count=16, cuda_device_count=2)


@pytest.mark.parametrize("setting, env, expect", [
    ("auto", CPU, ("cpu", 0)), ("auto", TWO_H100, ("cuda", 0)), ("cpu", TWO_H100, ("cpu", 0)),
    ("cuda", TWO_H100, ("cuda", 0)), ("cuda:1", TWO_H100, ("cuda", 1)),
])
def test_target_device_resolves_on_this_machine(setting, env, expect):
    assert resolve_device(setting, env) == expect


@pytest.mark.parametrize("setting, env, message", [
    ("cuda", CPU, "no CUDA device is present"), ("cuda:2", TWO_H100, "torch sees 2 CUDA device"),
    ("gpu", TWO_H100, "must be auto, cpu, cuda or cuda:N"), ("cpu:1", TWO_H100, "must be auto, cpu"),
])
def test_a_device_this_machine_lacks_is_refused(setting, env, message):
    with pytest.raises(ValueError, match=message):
        resolve_device(setting, env)


def _model_dir(tmp_path, dtype):
    (tmp_path / "config.json").write_text(json.dumps({"dtype": dtype}))
    return tmp_path


def test_baseline_on_cuda_runs_eager_at_the_checkpoints_dtype(tmp_path):
    target = Target("m", "causal-lm", _model_dir(tmp_path, "bfloat16"))
    base = EagerBaseline().apply(placed(target, "cuda:1", TWO_H100))
    assert (base.recipe.engine, base.recipe.precision, device_name(base.recipe)) == ("torch", "bf16", "cuda:1")
    on_cpu = EagerBaseline().apply(placed(target, "auto", CPU))
    assert (on_cpu.recipe.precision, device_name(on_cpu.recipe)) == ("fp32", "cpu")


def test_tensorrt_and_cuda_graph_refuse_a_cpu_champion_instead_of_moving_it(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())   # torch-tensorrt "installed"
    cpu_champion = EagerBaseline().apply(placed(Target("m", "causal-lm", Path("/x")), "cpu", TWO_H100))
    assert "target.device=cuda" in TensorRT().check(TWO_H100, cpu_champion)
    assert "target.device=cuda" in CudaGraph().check(TWO_H100, cpu_champion)


def test_engine_swaps_keep_the_champions_device():
    gpu_champion = Candidate(Target("m", "causal-lm", Path("/x")), Recipe(execution_provider="cuda"), ("baseline",))
    assert "does not move the model" in OpenVinoSwap().check(TWO_H100, gpu_champion)
    assert "does not move the model" in OnnxRuntimeSwap("cpu").check(TWO_H100, gpu_champion)
    assert OnnxRuntimeSwap().check(TWO_H100, gpu_champion) is None
    on_second = Candidate(gpu_champion.target, Recipe(execution_provider="cuda", cuda_device=1))
    assert "CUDA_VISIBLE_DEVICES=1" in OnnxRuntimeSwap().check(TWO_H100, on_second)


@pytest.mark.parametrize("device", ["cpu", "cuda:1"])
def test_no_rung_of_the_default_ladder_changes_the_device(tmp_path, device):
    from experiments.climb.validation import load_rungs

    cfg = compose([f"data_dir={tmp_path}"])
    champion = placed(Target("m", "causal-lm", _model_dir(tmp_path, "float32")), device, TWO_H100)
    for name, rung in load_rungs(cfg):
        if name == "distillation":   # its apply trains a student (minutes); it edits the target, not the recipe
            continue
        moved = rung.apply(champion)
        assert device_name(moved.recipe) == device, name
