"""Quantization that cannot happen says why; quantization that did not happen fails the rung.

CPU, measured: torch's dynamic int8 on a bf16 champion raised `expected scalar type Float but found BFloat16` in
the middle of a benchmark. torchao (CUDA only) is simulated: its `quantize_` returns a weight untouched when it
skips it, which would have been measured under the scheme's name."""
import sys
import types
from pathlib import Path

import pytest
import torch

from experiments.core.recipe import Candidate, Env, Recipe, Target
from experiments.serving.backends.pytorch.quantize import quantize_torchao
from optimizers.quantization import WeightQuantization

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
H100 = Env(cuda=True, cuda_capability=(9, 0), cpu_count=16)
TARGET = Target("t", "causal-lm", Path("/x"))


def test_int8_on_a_bf16_torch_champion_is_refused_with_the_reason():
    bf16 = Candidate(TARGET, Recipe(precision="bf16"), ("baseline", "half_precision"))
    reason = WeightQuantization("int8").check(CPU, bf16)
    assert "fp32 champion" in reason and "bf16" in reason
    assert WeightQuantization("int8").check(CPU, Candidate(TARGET, Recipe(precision="fp32"))) is None
    onnx_bf16 = Candidate(TARGET, Recipe(engine="onnxruntime", precision="bf16"))
    assert WeightQuantization("int8").check(CPU, onnx_bf16) is None   # quantizes from its fp32 export


def test_int8_on_a_compiled_torch_champion_is_refused_with_the_reason():
    # a fresh make sweep (1bf1831) kept torch_compile, then its int8 rung crashed minutes in: every quantized
    # projection broke dynamo's graph and the decode recompiled past its limit (FailOnRecompileLimitHit)
    compiled = Candidate(TARGET, Recipe(compile="inductor"), ("baseline", "torch_compile"))
    reason = WeightQuantization("int8").check(CPU, compiled)
    assert "breaks dynamo's graph" in reason and "ONNX Runtime" in reason
    on_cuda = Candidate(TARGET, Recipe(compile="inductor", execution_provider="cuda"), ("baseline",))
    assert WeightQuantization("int8").check(H100, on_cuda) is None      # torchao's int8 on CUDA: no such refusal


def test_torch_engine_refuses_bf16_int8_before_serving(tiny_target):
    from experiments.serving.backends.pytorch.causal_lm import TorchEngine

    with pytest.raises(ValueError, match="needs an fp32 champion"):
        TorchEngine(Candidate(tiny_target, Recipe(precision="bf16", quantization="int8")), 1)


def test_int4_on_cuda_needs_a_bf16_champion():
    fp16 = Candidate(TARGET, Recipe(precision="fp16", execution_provider="cuda"))
    assert "bf16 only" in WeightQuantization("int4").check(H100, fp16)
    bf16 = Candidate(TARGET, Recipe(precision="bf16", execution_provider="cuda"))
    assert WeightQuantization("int4").check(H100, bf16) is None


class _Quantized(torch.Tensor):
    """Stands for a torchao tensor subclass."""


def _fake_torchao(monkeypatch, quantize_):
    module = types.ModuleType("torchao.quantization")
    module.quantize_ = quantize_
    module.Int8WeightOnlyConfig = module.Float8DynamicActivationFloat8WeightConfig = lambda: "config"
    module.Int4WeightOnlyConfig = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.quantization", module)


def _layers():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))


def test_torchao_leaving_weights_unquantized_fails(monkeypatch):
    _fake_torchao(monkeypatch, lambda layers, config: None)   # skipped every weight, said nothing
    with pytest.raises(RuntimeError, match="left 2 of 2 Linear weights unquantized"):
        quantize_torchao(_layers(), "int8")


def test_torchao_quantized_weights_pass_and_int4_asks_for_the_tinygemm_layout(monkeypatch):
    configs = []

    def quantize_(layers, config):
        configs.append(config)
        for m in layers.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight = torch.nn.Parameter(m.weight.detach().as_subclass(_Quantized), requires_grad=False)

    _fake_torchao(monkeypatch, quantize_)
    quantize_torchao(_layers(), "int4")
    assert configs == [{"group_size": 32, "int4_packing_format": "tile_packed_to_4d"}]
