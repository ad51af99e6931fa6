"""The newer rungs really change what runs, and stay close to the baseline (tolerances from conf/gate)."""
import onnx
import pytest
import torch
from conftest import SHARED_CACHE, compose

from experiments.core.recipe import Candidate
from experiments.judge.fidelity import BaselineLogprobs, fixed_sequences, judge
from experiments.serving import build_engine
from optimizers.baseline import EagerBaseline
from optimizers.half_precision import HalfPrecision
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.quantization import WeightQuantization
from optimizers.torch_compile import TorchCompile

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tiny_target):
    return EagerBaseline().apply(Candidate(tiny_target))


@pytest.fixture(scope="module")
def reference(base):
    from experiments.targets.models.corpus import Corpus

    engine = build_engine(base, 2, SHARED_CACHE / "artefacts")
    windows = fixed_sequences(engine.tokenizer, Corpus.from_stdlib(8).heldout, 16, 128, 0)
    return BaselineLogprobs.record(engine, windows)


@pytest.fixture(scope="module")
def tolerances():
    fid = compose(["data_dir=/tmp/unused"]).gate.fidelity
    return fid.max_kl, fid.min_top1


def test_ort_int4_runs_4bit_matmuls_and_stays_close(base, reference, tolerances):
    engine = build_engine(WeightQuantization("int4").apply(OnnxRuntimeSwap().apply(base)), 2, SHARED_CACHE / "artefacts")
    graph = onnx.load(str(engine.folder / "model.onnx"), load_external_data=False).graph
    bits = {a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "bits"}
    assert bits == {4}
    assert 4.0 < engine.weight_bits() <= 5.0             # 4-bit weights plus a scale per block of 32
    report = reference.compare(engine)
    assert report.kl_mean > 1e-6                          # really different weights
    print(f"int4: KL {report.kl_mean:.2e}, top-1 {report.top1_agreement:.3f}, {engine.weight_bits():.2f} bits/weight")
    assert report.top1_agreement > 0.8                    # close, if not always inside the gate's tolerance
    # the gate judges this report on its own figures: failed below its KL or above its top-1, passed well within
    assert not judge(report, report.kl_mean / 2, 0.0).passed
    assert not judge(report, 1.0, min(1.0, report.top1_agreement + 0.01)).passed
    assert judge(report, 1.0, 0.5).passed
    print(f"int4 at the gate's tolerances: {judge(report, *tolerances).detail}")


def test_torch_bf16_holds_bf16_weights_and_stays_within_tolerance(base, reference, tolerances):
    engine = build_engine(HalfPrecision().apply(base), 2, SHARED_CACHE / "artefacts")
    assert engine.model.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    assert engine.weight_bits() == 16.0
    report = reference.compare(engine)
    assert report.kl_mean > 1e-7
    verdict = judge(report, *tolerances)
    assert verdict.passed, verdict.detail


def test_torch_compile_runs_a_compiled_module_with_the_same_tokens(base):
    eager = build_engine(base, 2, SHARED_CACHE / "artefacts")
    compiled = build_engine(TorchCompile().apply(base), 2, SHARED_CACHE / "artefacts")
    assert type(compiled._forward).__name__ == "OptimizedModule"
    assert compiled.build_seconds > 1.0                   # compilation happened at build, not under load
    prompt = list(range(10, 42))
    assert [t for t, _ in compiled.generate(prompt, 12)] == [t for t, _ in eager.generate(prompt, 12)]
