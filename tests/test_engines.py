"""The rungs really change what runs: ONNX Runtime executes the graph, INT8 weights are 8-bit, outputs agree."""
import types

import numpy as np
import onnx
import pytest
import torch

from experiments.core.recipe import Candidate
from experiments.serving import build_engine
from experiments.serving.backends.onnxruntime.causal_lm import OrtGenaiEngine
from experiments.serving.backends.pytorch.causal_lm import TorchEngine
from optimizers.baseline import EagerBaseline
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.quantization import WeightQuantization

pytestmark = pytest.mark.slow
PROMPTS = ["def __init__(self, name):\n", "import os\nimport sys\n\n", "    for i in range(len(items)):\n"]


@pytest.fixture(scope="module")
def engines(tiny_target, tmp_path_factory):
    from conftest import SHARED_CACHE

    base = EagerBaseline().apply(Candidate(tiny_target))
    ort = OnnxRuntimeSwap().apply(base)
    built = {
        "torch": build_engine(base, 2, SHARED_CACHE / "artefacts"),
        "torch-int8": build_engine(WeightQuantization("int8").apply(base), 2, SHARED_CACHE / "artefacts"),
        "ort": build_engine(ort, 2, SHARED_CACHE / "artefacts"),
        "ort-int8": build_engine(WeightQuantization("int8").apply(ort), 2, SHARED_CACHE / "artefacts"),
    }
    return built


def greedy(engine, text, n=12):
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    return [tok for tok, _ in engine.generate(ids, n)]


def test_engine_types_and_artefacts(engines):
    assert isinstance(engines["torch"], TorchEngine) and isinstance(engines["ort"], OrtGenaiEngine)
    ort = engines["ort"]
    assert (ort.folder / "model.onnx").exists() and (ort.folder / "genai_config.json").exists()
    assert engines["ort-int8"].artefact_bytes() < 0.6 * ort.artefact_bytes()


def test_ort_int8_graph_holds_8bit_matmuls_for_the_decoder_and_keeps_the_embedding_fp32(engines):
    graph = onnx.load(str(engines["ort-int8"].folder / "model.onnx"), load_external_data=False).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    bits = {a.i for n in nbits for a in n.attribute if a.name == "bits"}
    assert len(nbits) >= 4 * 4 and bits == {8}          # qkv, o, gate/up, down per layer (+ lm_head)
    gathers = [n for n in graph.node if n.op_type == "Gather" and "embed" in n.name.lower()]
    assert gathers, "the token embedding stays a plain (fp32) lookup"


def test_torch_int8_replaces_decoder_linears_with_quantized_ones(engines):
    layers = engines["torch-int8"].model.model.layers
    kinds = {type(m).__name__ for m in layers.modules()}
    assert "Linear" in kinds and any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in layers.modules())
    assert not any(type(m) is torch.nn.Linear for m in layers.modules())
    assert type(engines["torch-int8"].model.lm_head) is torch.nn.Linear   # tied with the embedding: untouched


def test_onnxruntime_fp32_decodes_exactly_what_torch_decodes(engines):
    for text in PROMPTS:
        assert greedy(engines["ort"], text) == greedy(engines["torch"], text)


def test_int8_stays_close_to_fp32(engines):
    agree = np.mean([np.mean(np.array(greedy(engines["ort-int8"], t)) == np.array(greedy(engines["ort"], t)))
                     for t in PROMPTS])
    assert agree >= 0.5


def test_onnx_session_lm_matches_hflm_on_the_same_weights(engines):
    from lm_eval.api.instance import Instance

    reqs = [Instance("loglikelihood", {}, (ctx, cont), i) for i, (ctx, cont) in enumerate(
        [("def f(x):\n", "    return x"), ("import os\n", "import sys"), ("class A:\n", "    pass")])]
    answers = {}
    for name in ("torch", "ort"):
        lm = engines[name].lm_eval_model(batch_size=4)
        seen = []
        lm.cache_hook = types.SimpleNamespace(add_partial=lambda attr, req, res, seen=seen: seen.append(attr))
        answers[name] = lm.loglikelihood(reqs, disable_tqdm=True)
        assert seen == ["loglikelihood"] * 3      # what lm-eval's progress counts: one per request
    for (a, ga), (b, gb) in zip(answers["torch"], answers["ort"]):
        assert a == pytest.approx(b, abs=1e-3) and ga == gb


def test_artefacts_are_reused_when_nothing_changed(engines, tiny_target):
    from conftest import SHARED_CACHE

    again = build_engine(OnnxRuntimeSwap().apply(EagerBaseline().apply(Candidate(tiny_target))), 2,
                         SHARED_CACHE / "artefacts")
    assert again.reused and again.folder == engines["ort"].folder
