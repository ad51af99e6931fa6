"""Every CPU rung on two decoder architectures, Llama (SmolLM2's) and Qwen2 (q/k/v biases, ChatML): each rung's
check lets it through and its engine decodes the eager baseline's greedy tokens, exactly for an engine swap or
batching, within a stated agreement for a changed numeric format; a rung that refuses either fails.
Distillation's student, the roofline's shape and the memory estimate are read from either model."""
import json

import own_models
import pytest
import torch

from experiments.core.recipe import Candidate, Env, Target
from experiments.core.request import Prompt
from experiments.serving import build_engine
from experiments.serving.servers import serve
from optimizers.baseline import EagerBaseline
from optimizers.batching import Batching
from optimizers.half_precision import HalfPrecision
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.openvino_engine import OpenVinoSwap
from optimizers.prefix_caching import PrefixCaching
from optimizers.quantization import WeightQuantization

pytestmark = pytest.mark.slow

ARCHITECTURES = ["LlamaForCausalLM", "Qwen2ForCausalLM"]
CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
TOKENS = 8
# Share of the baseline's greedy tokens (up to each prompt's first disagreement) a rung must keep: all for an
# engine swap or a batching scheduler; fewer for a changed numeric format, whose damage these random weights (std
# 0.2, far wider than a trained model's) magnify. Measured shares: bf16 88-100 %, int8 38-81 %, int4 3-12 %;
# int4 must only decode (its closeness on a trained model is test_rungs_real's, top-1 agreement > 0.8).
MIN_SHARE = {"exact": 1.0, "bf16": 0.5, "int8": 0.25, "int4": 0.0}
ORT, OV = OnnxRuntimeSwap(), OpenVinoSwap()
CONTINUOUS_OWN = Batching("continuous", 4, kv_block_size=16, kv_num_blocks=64, max_tokens_per_step=64, scheduler="own")
CONTINUOUS_PAGED = Batching("continuous", 4, kv_block_size=16, kv_num_blocks=64, max_tokens_per_step=64)
# (rung label, the rungs from the eager baseline, how close its tokens must be)
LADDER = [
    ("onnxruntime", [ORT], "exact"),
    ("openvino", [OV], "exact"),
    ("static_batching", [ORT, Batching("static", 4, 50)], "exact"),
    ("dynamic_batching", [ORT, Batching("dynamic", 4, 5)], "exact"),
    ("continuous_batching (own scheduler)", [CONTINUOUS_OWN], "exact"),
    ("prefix_caching (transformers' paged manager)", [CONTINUOUS_PAGED, PrefixCaching()], "exact"),
    ("half_precision (torch bf16)", [HalfPrecision()], "bf16"),
    ("int8 (torch)", [WeightQuantization("int8")], "int8"),
    ("int8 (onnxruntime)", [ORT, WeightQuantization("int8")], "int8"),
    ("int4 (onnxruntime)", [ORT, WeightQuantization("int4")], "int4"),
    ("int8 (openvino)", [OV, WeightQuantization("int8")], "int8"),
    ("int4 (openvino)", [OV, WeightQuantization("int4")], "int4"),
]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def folder(request, tmp_path_factory):
    return own_models.build(tmp_path_factory.mktemp("arch") / request.param.lower(), request.param)


@pytest.fixture(scope="module")
def prompts(folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    texts = ["def bisect(a, x):\n    ", "import string\n", "class TextWrapper:\n    \"\"\"", "# colour spaces\n"]
    return tuple(Prompt(i, tuple(tok(t)["input_ids"]), TOKENS) for i, t in enumerate(texts))


@pytest.fixture(scope="module")
def baseline(folder, prompts):
    cand = EagerBaseline().apply(Candidate(Target(folder.name, "causal-lm", folder)))
    return cand, decoded(build_engine(cand, 1, folder.parent / "artefacts"), prompts)


def decoded(engine, prompts) -> list[list[int]]:
    server = serve(engine)
    try:
        records = [server.submit(p) for p in prompts]
        for r in records:
            assert r.done.wait(120) and r.error is None, r.error
        return [list(r.tokens) for r in records]
    finally:
        server.close()
        engine.close()


def agreed_share(reference, got, stop: int) -> float:
    """Tokens equal to the reference's up to each prompt's first difference, over all reference tokens; the
    reference cut at its first stop token (torch emits it and goes on, onnxruntime-genai bans it: both served the
    same answer, as experiments/judge/agreement.py compares)."""
    reference = [ref[:ref.index(stop)] if stop in ref else ref for ref in reference]
    same = 0
    for ref, out in zip(reference, got):
        for a, b in zip(ref, out):
            if a != b:
                break
            same += 1
    return same / max(1, sum(map(len, reference)))


@pytest.mark.parametrize("label,rungs,closeness", LADDER, ids=[label.split(" ")[0] for label, *_ in LADDER])
def test_each_cpu_rung_decodes_the_baselines_tokens_on_both_architectures(
        folder, prompts, baseline, label, rungs, closeness):
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    cand, reference = baseline
    for rung in rungs:       # every rung of LADDER applies to both: a refusal is a lost architecture
        assert not (reason := rung.check(CPU, cand)), f"{label} on {architecture}: refused: {reason}"
        cand = rung.apply(cand)
    got = decoded(build_engine(cand, 1, folder.parent / "artefacts"), prompts)
    share = agreed_share(reference, got, json.loads((folder / "config.json").read_text())["eos_token_id"])
    print(f"{architecture} {label}: {share:.0%} of the baseline's greedy tokens")
    assert [len(out) for out in got] == [TOKENS] * len(prompts)
    assert share >= MIN_SHARE[closeness], (label, architecture, reference, got)


def test_distillation_keeps_a_subset_of_either_decoders_layers(folder, prompts, tmp_path):
    from transformers import AutoModelForCausalLM

    from experiments.targets.models.student import DistillSettings, distill

    settings = DistillSettings(student_layers=1, steps=2, seq_len=32, batch_size=2, lr=1e-3, temperature=2.0,
                               alpha=0.9, seed=0)
    texts = [own_models.stdlib_text("textwrap.py")]
    result = distill(folder, texts, settings, tmp_path, 1, lambda *a: None)
    student = AutoModelForCausalLM.from_pretrained(result.path)
    teacher = AutoModelForCausalLM.from_pretrained(folder)
    assert type(student) is type(teacher) and student.config.num_hidden_layers == 1
    out = student.generate(torch.tensor([prompts[0].token_ids]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == len(prompts[0].token_ids) + 4


def test_the_roofline_shape_and_the_memory_estimate_read_either_config(folder):
    from transformers import AutoConfig, AutoModelForCausalLM

    from experiments.analyse.memory_fit import parameter_count
    from experiments.analyse.roofline import ModelShape

    config = AutoConfig.from_pretrained(folder)
    shape = ModelShape.from_config(config)
    assert (shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.head_dim,
            shape.vocab) == (2, 64, 128, 4, 2, 16, config.vocab_size)
    model = AutoModelForCausalLM.from_pretrained(folder)
    real = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert parameter_count(folder) == real
    assert abs(shape.params - real) / real < 0.02, (shape.params, real)   # norms and biases left out
