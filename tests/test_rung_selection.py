"""Which rung applies where: GPU rungs are skipped on CPU with a reason and selected when CUDA is present.

The selection logic is tested with an Env that says CUDA is there; what runs on a GPU is exercised by the
prepared device script (scripts/gpu_rungs.py) when a GPU is lent."""
from pathlib import Path

import pytest

from experiments.core.recipe import Candidate, Env, Target
from optimizers.baseline import EagerBaseline
from optimizers.batching import Batching
from optimizers.cuda_graph import CudaGraph
from optimizers.half_precision import HalfPrecision
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.quantization import WeightQuantization
from optimizers.tensorrt import TensorRT
from optimizers.torch_compile import TorchCompile

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
H100 = Env(cuda=True, cuda_capability=(9, 0), cpu_count=16)
A100 = Env(cuda=True, cuda_capability=(8, 0), cpu_count=16)
BASE = EagerBaseline().apply(Candidate(Target("t", "causal-lm", Path("/x"))))
ORT = OnnxRuntimeSwap().apply(BASE)
CUDA_TORCH = BASE.edited("to_cuda", execution_provider="cuda")


def test_torch_compile_applies_to_torch_only():
    assert TorchCompile().check(CPU, BASE) is None
    assert TorchCompile().apply(BASE).recipe.compile == "inductor"
    assert "champion runs onnxruntime" in TorchCompile().check(CPU, ORT)
    assert "already compiled" in TorchCompile().check(CPU, TorchCompile().apply(BASE))


def test_engine_swap_to_onnxruntime_drops_torch_only_settings():
    compiled = TorchCompile().apply(BASE)
    assert OnnxRuntimeSwap().apply(compiled).recipe.compile == "none"


def test_tensorrt_is_skipped_without_cuda_and_selected_with_it(monkeypatch):
    assert "no CUDA device" in TensorRT().check(CPU, ORT)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    cuda_ort = OnnxRuntimeSwap().apply(CUDA_TORCH)
    assert TensorRT().check(H100, cuda_ort) is None
    recipe = TensorRT().apply(cuda_ort).recipe
    assert (recipe.engine, recipe.compile, recipe.execution_provider, recipe.precision) == \
        ("torch", "tensorrt", "cuda", "fp32")   # the champion's device and dtype: the swap alone


def test_tensorrt_says_to_install_the_gpu_extra_when_missing(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert "pip install -e '.[gpu]'" in TensorRT().check(H100, ORT)


def test_cuda_graph_only_with_cuda_and_a_torch_champion():
    assert "no CUDA device" in CudaGraph().check(CPU, BASE)
    assert CudaGraph().check(H100, CUDA_TORCH) is None
    assert CudaGraph().apply(CUDA_TORCH).recipe.cuda_graph
    assert "champion runs onnxruntime" in CudaGraph().check(H100, ORT)
    assert "target.device" in CudaGraph().check(H100, BASE)   # a CPU champion is not moved


def test_half_precision_is_bf16_on_cpu_and_fp16_on_cuda():
    rung = HalfPrecision(cpu_dtype="bf16", cuda_dtype="fp16")
    assert rung.check(CPU, BASE) is None and rung.apply(BASE).recipe.precision == "bf16"
    assert rung.check(H100, CUDA_TORCH) is None and rung.apply(CUDA_TORCH).recipe.precision == "fp16"
    assert "no bf16 Where kernel" in rung.check(CPU, ORT)
    assert HalfPrecision(cpu_dtype="fp16").check(CPU, ORT) is None
    # fp16 on the CPU is torch's limit, said by its engine (the causal LM's and the encoder's alike)
    assert "few fp16 CPU kernels" in HalfPrecision(cpu_dtype="fp16").check(CPU, BASE)
    assert "already runs bf16" in rung.check(CPU, rung.apply(BASE))
    with pytest.raises(ValueError, match="cpu_dtype"):
        HalfPrecision(cpu_dtype="int8")


@pytest.mark.parametrize("scheme,cand,env,expect", [
    ("int8", BASE, CPU, None), ("int8", ORT, CPU, None), ("int8", CUDA_TORCH, H100, None),
    ("int4", ORT, CPU, None), ("int4", BASE, CPU, "no CPU kernel"), ("int4", CUDA_TORCH, H100, "bf16 only"),
    ("int4", CUDA_TORCH.edited("half_precision", precision="bf16"), H100, None),
    ("fp8", BASE, CPU, "needs a CUDA device"), ("fp8", ORT, H100, "no FP8 weight path"),
    ("fp8", CUDA_TORCH, A100, "compute capability >= 8.9"), ("fp8", CUDA_TORCH, H100, None),
    ("fp8", WeightQuantization("int4").apply(ORT), CPU, "needs a CUDA device"),   # not "already quantized"
    ("int8", WeightQuantization("int4").apply(ORT), CPU, "already quantized (int4)"),
])
def test_quantization_schemes_select_by_engine_and_device(scheme, cand, env, expect):
    reason = WeightQuantization(scheme).check(env, cand)
    if expect is None:
        assert reason is None
        assert WeightQuantization(scheme).apply(cand).recipe.quantization == scheme
    else:
        assert expect in reason


def test_batching_order_and_engine():
    static, dynamic = Batching("static", 8, 200), Batching("dynamic", 8, 5)
    assert "onnxruntime-genai's Engine" in static.check(CPU, BASE)
    assert dynamic.check(CPU, ORT) is None
    assert "already uses dynamic" in static.check(CPU, dynamic.apply(ORT))


def test_a_rung_asks_the_engine_of_the_candidate_it_would_produce():
    from experiments.serving import engine_class, refusal
    from experiments.serving.backends.openvino.causal_lm import OpenVinoCausalLM
    from experiments.serving.backends.pytorch.causal_lm import TorchEngine

    bf16 = BASE.edited("half_precision", precision="bf16")
    int8 = WeightQuantization("int8").apply(bf16)
    assert engine_class(int8) is TorchEngine and "fp32 champion" in TorchEngine.refuses(int8)
    assert WeightQuantization("int8").check(CPU, bf16) == refusal(int8)        # the engine's words, not a copy
    openvino_bf16 = BASE.edited("openvino", engine="openvino", precision="bf16")
    assert engine_class(openvino_bf16) is OpenVinoCausalLM and "fp32" in refusal(openvino_bf16)
    assert "no 'tvm' engine for a causal-lm target" in refusal(BASE.edited("tvm", engine="tvm"))
    assert refusal(BASE) is None and refusal(ORT) is None
