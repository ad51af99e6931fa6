"""GPU techniques that did not take effect fail the rung with the reason, never a silent relabel. No GPU here: each
library's quiet way out is simulated (monkeypatch), the way it happens: torch-tensorrt dropping an option it does
not know, ONNX Runtime falling back to its CPU provider. (CUDA graphs: tests/test_cuda_graph_engine.py.)"""
import dataclasses
import json
import sys
import types

import numpy as np
import pytest

from experiments.core import gpu_guards
from experiments.core.gpu_guards import require_provider, tensorrt_options
from experiments.core.recipe import Candidate, Recipe, Target

CUDA1 = Recipe(execution_provider="cuda", cuda_device=1)


def _fake_torch_tensorrt(monkeypatch, *fields):
    settings = dataclasses.make_dataclass("CompilationSettings", [(f, object, None) for f in fields])
    package, dynamo = types.ModuleType("torch_tensorrt"), types.ModuleType("torch_tensorrt.dynamo")
    package.__version__, dynamo.CompilationSettings = "2.99.0", settings
    monkeypatch.setitem(sys.modules, "torch_tensorrt", package)
    monkeypatch.setitem(sys.modules, "torch_tensorrt.dynamo", dynamo)


def test_tensorrt_conversion_failures_raise_instead_of_returning_the_torch_graph(monkeypatch):
    _fake_torch_tensorrt(monkeypatch, "pass_through_build_failures", "min_block_size", "use_explicit_typing")
    options = tensorrt_options()
    assert options["pass_through_build_failures"] is True and "enabled_precisions" not in options


def test_a_tensorrt_release_without_the_option_fails_loudly(monkeypatch):
    _fake_torch_tensorrt(monkeypatch, "min_block_size")   # the backend would drop the option without a word
    with pytest.raises(RuntimeError, match="no setting pass_through_build_failures.*drop it silently"):
        tensorrt_options()


def test_the_installed_torch_tensorrt_knows_the_options():
    pytest.importorskip("torch_tensorrt", reason="torch-tensorrt is in the gpu extra only; not installed here")
    assert tensorrt_options()["pass_through_build_failures"] is True


class _Session:
    """ONNX Runtime's InferenceSession when the CUDA provider did not load: it runs on the CPU, says so in a log."""
    def __init__(self, path, options=None, providers=()):
        self.asked = providers

    def get_providers(self):
        return ["CPUExecutionProvider"]


def test_onnxruntime_falling_back_to_the_cpu_fails():
    with pytest.raises(RuntimeError, match="did not load CUDAExecutionProvider; the session runs on CPU"):
        require_provider(_Session("m.onnx"), "CUDAExecutionProvider")


def test_the_ort_encoder_on_cuda_asks_for_its_device_and_refuses_the_fallback(monkeypatch, tmp_path):
    import onnxruntime

    from experiments.serving.backends.onnxruntime import encoder

    sessions = []
    monkeypatch.setattr(encoder, "export_onnx", lambda cand, root: (tmp_path / "model.onnx", True))
    monkeypatch.setattr(onnxruntime, "InferenceSession", lambda *a, **kw: sessions.append(_Session(*a, **kw))
                        or sessions[-1])
    with pytest.raises(RuntimeError, match="did not load CUDAExecutionProvider"):
        encoder.OrtEncoder(Candidate(Target("m", "embedding", tmp_path), CUDA1), 1, tmp_path)
    assert sessions[0].asked[0] == ("CUDAExecutionProvider", {"device_id": 1})


def test_onnxruntime_genai_placing_the_model_on_the_cpu_fails(monkeypatch, tmp_path):
    import onnxruntime_genai as og

    from experiments.serving.backends.onnxruntime import causal_lm as ort_engine

    class Config:
        def __init__(self, folder):
            pass

        def overlay(self, text):
            pass

    monkeypatch.setattr(ort_engine, "export", lambda cand, root: (tmp_path, True))
    monkeypatch.setattr(og, "Config", Config)
    monkeypatch.setattr(og, "Model", lambda config: types.SimpleNamespace(device_type="CPU"))
    with pytest.raises(RuntimeError, match="placed the model on CPU, not cuda"):
        ort_engine.OrtGenaiEngine(Candidate(Target("m", "causal-lm", tmp_path),
                                            Recipe(engine="onnxruntime", execution_provider="cuda")), 1, tmp_path)


def _export_with_past(folder, elem_type):
    """A stand-in for an onnxruntime-genai export: its inputs (past tensors of `elem_type`) and a logits output."""
    import onnx
    from onnx import TensorProto, helper

    past = [helper.make_tensor_value_info(f"past_key_values.0.{kv}", elem_type, [1, 1, "past", 4])
            for kv in ("key", "value")]
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "seq"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "seq"])
    graph = helper.make_graph([helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)],
                              "g", [ids, mask, *past], [logits])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
              folder / "model.onnx")
    (folder / "genai_config.json").write_text(json.dumps({"model": {"context_length": 64, "decoder": {
        "num_key_value_heads": 1, "head_size": 4, "num_hidden_layers": 1}}}))
    return folder / "model.onnx"


def test_ort_scoring_feeds_the_exports_own_past_dtype(tmp_path):
    from onnx import TensorProto

    from experiments.judge.accuracy import OnnxSessionLM

    lm = OnnxSessionLM(_export_with_past(tmp_path, TensorProto.FLOAT16), None, 1)
    assert {a.dtype for a in lm._empty_past.values()} == {np.dtype(np.float16)}


def test_ort_scoring_refuses_past_tensors_numpy_cannot_hold(tmp_path):
    from onnx import TensorProto

    from experiments.judge.accuracy import OnnxSessionLM

    with pytest.raises(ValueError, match="tensor\\(bfloat16\\), which numpy cannot hold"):
        OnnxSessionLM(_export_with_past(tmp_path, TensorProto.BFLOAT16), None, 1)


def test_cpu_recipes_ask_onnxruntime_for_the_cpu_only():
    assert gpu_guards.ort_providers(Recipe()) == ["CPUExecutionProvider"]
