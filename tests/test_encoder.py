"""The embedding target kind on the real all-MiniLM-L6-v2: engines, batching, report, rungs, preset."""
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose
from omegaconf import OmegaConf

from experiments.climb.validation import load_rungs
from experiments.core.errors import ConfigError
from experiments.core.recipe import Candidate, Env, Recipe, Target
from experiments.judge.embedding_eval import BaselineEmbeddings, judge_cosine
from experiments.measure.load_ladder import run_benchmark
from experiments.record import benchmark_log
from experiments.serving import build_engine
from experiments.targets.models.minilm import RetrievalSet, model_dir
from experiments.targets.resolve import check_source
from experiments.targets.workload import Workload

pytestmark = pytest.mark.builds      # every test here loads the real MiniLM
CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Return the absolute value of a number.",
             "Open file and return a corresponding file object. If the file cannot be opened, an OSError is raised.",
             "ok"]


@pytest.fixture(scope="module")
def target():
    return Target("minilm", "embedding", model_dir())


@pytest.fixture(scope="module")
def tokenizer(target):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target.model_dir)


def reference_embeddings(target, tokenizer, texts):
    """sentence-transformers' recipe for this model, written out independently: the model as transformers loads
    it by default (its own attention and masking), one text at a time (no padding), mean over tokens, L2 norm."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(target.model_dir).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            enc = tokenizer(text, return_tensors="pt")
            hidden = model(**enc).last_hidden_state[0]
            out.append(torch.nn.functional.normalize(hidden.mean(0), dim=0).numpy())
    return np.stack(out)


@pytest.mark.parametrize("engine", ["torch", "onnxruntime"])
def test_embeddings_match_sentence_transformers_mean_pooling(engine, target, tokenizer, tmp_path):
    expected = reference_embeddings(target, tokenizer, SENTENCES)
    enc = build_engine(Candidate(target, Recipe(engine=engine)), 2, tmp_path)
    got, seconds = enc.embed([tokenizer(s)["input_ids"] for s in SENTENCES])   # one padded batch
    assert got.shape == (4, 384) and seconds > 0
    assert np.abs(got - expected).max() < 1e-4
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    # what the model is known for: a paraphrase is nearer than an unrelated sentence
    para, other = enc.embed([tokenizer("Give back a number's absolute value.")["input_ids"],
                             tokenizer("The weather in spring is mild.")["input_ids"]])[0]
    assert got[1] @ para > 0.6 > got[1] @ other


def test_int8_candidate_cosine_is_measured_and_gated(target, tokenizer, tmp_path):
    texts = RetrievalSet.from_stdlib(40, 0).texts()
    baseline = build_engine(Candidate(target), 2, tmp_path)
    reference = BaselineEmbeddings.record(lambda b: baseline.embed(b)[0], tokenizer, texts, 16, 128)
    int8 = build_engine(Candidate(target, Recipe(engine="onnxruntime", quantization="int8")), 2, tmp_path)
    report = reference.compare(lambda b: int8.embed(b)[0])
    assert report.n == 80 and 0.95 < report.min <= report.mean < 0.9999   # really changed, not broken
    assert 7.5 < int8.weight_bits() < 8.5
    assert judge_cosine(report, 0.98, 0.95).passed
    strict = judge_cosine(report, 0.9999, 0.95)
    assert not strict.passed and strict.name == "fidelity" and "cosine" in strict.detail
    same = reference.compare(lambda b: baseline.embed(b)[0])
    assert same.min > 0.99999


def test_dynamic_batching_report_fits_an_encoder(target, tokenizer, tmp_path):
    workload = Workload.from_sentences(RetrievalSet.from_stdlib(50, 1).texts(), tokenizer, 64, 4, 0, 128, "embedding")
    cand = Candidate(target, Recipe(engine="onnxruntime", batching="dynamic", max_batch=8, max_wait_ms=5))
    engine = build_engine(cand, 2, tmp_path)
    cfg = OmegaConf.create({"concurrency": [1, 8], "warmup_requests": 4, "min_requests": 24, "min_duration_s": 0.2,
                            "max_duration_s": 30, "request_timeout_s": 30, "mode": "closed", "slos": []})
    report = run_benchmark(engine, workload, cfg)
    c1, c8 = report.levels
    assert set(c8.stats) == {"e2e_ms", "queue_ms", "model_ms", "batch_ms"}      # no TTFT / TPOT / ITL
    assert c1.batch_size_mean == 1 and c8.batch_size_mean > 2                   # concurrent requests share a batch
    assert len(c8.values("batch_ms")) < c8.n_ok                                 # one latency per batch
    series = benchmark_log.metric_series(report)
    assert "embeddings_per_s" in series and "batch_ms_p50" in series and "input_tokens_per_s" in series
    assert not [k for k in series if k.startswith(("ttft", "tpot", "itl", "output_tokens"))]
    rows = benchmark_log.samples_csv(report).splitlines()
    assert all(row.split(",")[5] == "" for row in rows[1:])                     # the ttft_ms column stays empty


def test_inapplicable_rungs_say_why_and_the_rest_apply(target, tmp_path):
    rungs = dict(load_rungs(compose(["target=minilm", f"data_dir={tmp_path}"])))
    torch_champion = Candidate(target)
    ort_champion = rungs["onnxruntime"].apply(torch_champion)
    reasons = {name: rungs[name].check(CPU, ort_champion) for name in rungs}
    for name in ("onnxruntime",):
        assert rungs[name].check(CPU, torch_champion) is None
    for name in ("openvino", "dynamic_batching", "static_batching", "int8", "int4"):
        assert reasons[name] is None, (name, reasons[name])
    assert "encoder" in reasons["continuous_batching"] and "KV cache" in reasons["prefix_caching"]
    assert "encoder" in reasons["distillation"]
    for name in ("tensorrt", "cuda_graph", "fp8"):
        assert "CUDA" in reasons[name]
    assert "bf16" in reasons["half_precision"]                       # ONNX Runtime's CPU kernels: said why
    assert rungs["half_precision"].check(CPU, torch_champion) is None   # torch bf16 applies


def test_rag_preset_sweeps_both_targets_into_one_experiment(tmp_path):
    cfg = compose(["experiment=rag", f"data_dir={tmp_path}"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert sorted(cfg.hydra.sweeper.params.target.split(",")) == ["minilm", "tiny-llm"]
    assert cfg.tracking.experiment == "roi-ladder/rag"
    for name in ("minilm", "tiny-llm"):   # each job of the multirun composes
        job = compose(["experiment=rag", f"target={name}", f"data_dir={tmp_path}"])
        assert job.target.name == name and job.tracking.experiment == "roi-ladder/rag"


def test_bad_embedding_config_is_refused_before_work(tmp_path):
    cfg = compose(["target=minilm", "target.kind=causal-lm", f"data_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="does not match builtin:minilm"):
        check_source(cfg.target)
    from experiments.climb.validation import validate

    cfg = compose(["target=minilm", "target.scoring.recall_at=[0]", f"data_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="recall_at"):
        validate(cfg)
    cfg = compose(["target=minilm", "target.scoring.min_cosine_min=0.999", f"data_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="min_cosine_min <= min_cosine_mean"):
        validate(cfg)


def test_slos_on_latencies_an_encoder_lacks_are_left_out():
    from experiments.core.names import ENCODER_METRICS, LATENCY_METRICS
    from experiments.core.slo import applicable, parse_all

    slos = parse_all(["p95_ttft_ms<=100", "p99_e2e_ms<=500", "p50_tpot_ms<=5"])
    kept, left_out = applicable(slos, ENCODER_METRICS)
    assert [s.text for s in kept] == ["p99_e2e_ms<=500"]
    assert [s.text for s in left_out] == ["p95_ttft_ms<=100", "p50_tpot_ms<=5"]
    assert applicable(slos, LATENCY_METRICS) == (slos, [])


def test_paths_built_for_decoders_refuse_an_encoder_with_the_reason(target, tmp_path):
    from experiments.climb.endpoint import _completions_only
    from optimizers.half_precision import HalfPrecision
    from optimizers.openvino_engine import OpenVinoSwap

    with pytest.raises(ConfigError, match="/v1/completions only"):
        _completions_only(target.name, target.kind)
    ort = Candidate(target, Recipe(engine="onnxruntime"))
    assert "fp32 export only" in HalfPrecision(cpu_dtype="fp16").check(CPU, ort)
    causal = Candidate(Target("t", "causal-lm", Path("/x")), Recipe(engine="onnxruntime", batching="dynamic"))
    assert "onnxruntime-genai's Engine" in OpenVinoSwap().check(CPU, causal)
    from experiments.targets import kinds

    cfg = compose(["target=minilm", "target.scoring.queries=4", "target.scoring.recall_at=[1,5]",
                   f"data_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="k <= target.scoring.queries"):
        kinds.for_target(cfg, target, ["a", "b"], None)
