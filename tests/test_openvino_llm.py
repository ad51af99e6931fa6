"""The OpenVINO causal LM on the tiny-llm: greedy parity and log-prob parity with torch eager, NNCF int8/int4 weight
bits, the IR cache, and the engine-swap rung now taking a causal LM."""
import numpy as np
import pytest

from experiments.core.recipe import Candidate, Env, Recipe
from experiments.serving import build_engine
from experiments.serving.backends.openvino.causal_lm import OpenVinoCausalLM
from optimizers.baseline import EagerBaseline
from optimizers.openvino_engine import OpenVinoSwap
from optimizers.quantization import WeightQuantization

pytestmark = pytest.mark.slow
PROMPTS = ["def __init__(self, name):\n", "import os\nimport sys\n\n", "    for i in range(len(items)):\n"]
CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)


@pytest.fixture(scope="module")
def artefacts():
    from conftest import SHARED_CACHE

    return SHARED_CACHE / "artefacts"   # content-hashed: shared with `make sweep`


@pytest.fixture(scope="module")
def baseline(tiny_target):
    return EagerBaseline().apply(Candidate(tiny_target))


@pytest.fixture(scope="module")
def engines(baseline, artefacts):
    swapped = OpenVinoSwap().apply(baseline)
    return {"torch": build_engine(baseline, 2, artefacts), "fp32": build_engine(swapped, 2, artefacts),
            "int8": build_engine(WeightQuantization("int8").apply(swapped), 2, artefacts),
            "int4": build_engine(WeightQuantization("int4").apply(swapped), 2, artefacts)}


def greedy(engine, text, n=12):
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    return [tok for tok, _ in engine.generate(ids, n)]


def test_the_rung_swaps_a_causal_lm(baseline):
    assert OpenVinoSwap().check(CPU, baseline) is None


def test_fp32_decodes_exactly_what_torch_decodes(engines):
    assert isinstance(engines["fp32"], OpenVinoCausalLM)
    for text in PROMPTS:
        assert greedy(engines["fp32"], text) == greedy(engines["torch"], text)


def test_logprobs_match_torch(engines):
    from experiments.judge.fidelity import logprob_scorer

    ids = engines["torch"].tokenizer.encode("".join(PROMPTS), add_special_tokens=False)
    ours = engines["fp32"].lm_eval_model(batch_size=1)._logprobs(ids)
    assert ours.shape == (len(ids), 2048)
    assert np.abs(ours - logprob_scorer(engines["torch"])(ids)).max() < 1e-3


def test_loglikelihood_matches_hflm(engines):
    from lm_eval.api.instance import Instance

    reqs = [Instance("loglikelihood", {}, (ctx, cont), i) for i, (ctx, cont) in enumerate(
        [("def f(x):\n", "    return x"), ("import os\n", "import sys")])]
    hf = engines["torch"].lm_eval_model(batch_size=2).loglikelihood(reqs, disable_tqdm=True)
    ov = engines["fp32"].lm_eval_model(batch_size=2).loglikelihood(reqs, disable_tqdm=True)
    for (a, greedy_a), (b, greedy_b) in zip(hf, ov):
        assert a == pytest.approx(b, abs=1e-3) and greedy_a == greedy_b


def test_nncf_weights_are_compressed_and_decode_close(engines):
    assert engines["fp32"].weight_bits() == 32
    assert 7.5 <= engines["int8"].weight_bits() <= 8.5
    assert engines["int4"].weight_bits() < 5.5
    assert engines["int4"].artefact_bytes() < engines["int8"].artefact_bytes() < engines["fp32"].artefact_bytes() / 2
    agree = np.mean([np.mean(np.array(greedy(engines["int8"], t)) == np.array(greedy(engines["fp32"], t)))
                     for t in PROMPTS])
    assert agree >= 0.5


def test_the_ir_is_reused(engines, baseline, artefacts):
    again = build_engine(OpenVinoSwap().apply(baseline), 2, artefacts)
    assert again.reused and again.path == engines["fp32"].path
    assert [p.suffix for p in again.artefact_paths()] == [".xml", ".bin"]
    assert again.rebuild_seconds() == again.load_seconds


def test_precision_other_than_fp32_is_refused(tiny_target, artefacts):
    with pytest.raises(ValueError, match="fp32"):
        OpenVinoCausalLM(Candidate(tiny_target, Recipe(engine="openvino", precision="bf16")), 2, artefacts)
