"""The batching schedulers over onnxruntime-genai's Engine: same tokens as one-at-a-time, and their waits."""
import pytest
from omegaconf import OmegaConf

from experiments.core.recipe import Candidate, Env
from experiments.core.request import Prompt
from experiments.measure.load_ladder import run_benchmark
from experiments.serving import build_engine
from experiments.serving.batching import BatchingServer
from experiments.serving.servers import SequentialServer, serve
from experiments.targets.workload import Workload
from optimizers.baseline import EagerBaseline
from optimizers.batching import Batching
from optimizers.onnxruntime_engine import OnnxRuntimeSwap

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
GPU = Env(cuda=True, cuda_capability=(9, 0), cpu_count=16)


def ort_candidate(target):
    return OnnxRuntimeSwap().apply(EagerBaseline().apply(Candidate(target)))


def test_static_and_dynamic_batching_apply_to_onnxruntime_only(tiny_target):
    torch_cand = EagerBaseline().apply(Candidate(tiny_target))
    assert "drive onnxruntime-genai" in Batching("dynamic", 8).check(CPU, torch_cand)
    ort = ort_candidate(tiny_target)
    assert Batching("dynamic", 8).check(CPU, ort) is None
    # continuous: paged onnxruntime-genai on CUDA, transformers' manager over torch elsewhere (test_continuous)
    assert "set a block count" in Batching("continuous", 32).check(CPU, ort)
    dyn = Batching("dynamic", 8, 5).apply(ort)
    assert "already uses dynamic" in Batching("static", 8).check(CPU, dyn)
    with pytest.raises(ValueError, match="kind must be"):
        Batching("adaptive", 8)


@pytest.mark.slow
def test_batched_tokens_equal_one_at_a_time_and_waits_follow_the_policy(tiny_target):
    from conftest import SHARED_CACHE

    ort = ort_candidate(tiny_target)
    plain = build_engine(ort, 2, SHARED_CACHE / "artefacts")
    prompts = tuple(Prompt(i, tuple(range(5 + i, 25 + i)), 12) for i in range(6))
    seq = SequentialServer(plain)
    expected = [seq.submit(p) for p in prompts]
    for r in expected:
        r.done.wait(30)
    seq.close()

    dyn_engine = build_engine(Batching("dynamic", 4, 20).apply(ort), 2, SHARED_CACHE / "artefacts")
    server = serve(dyn_engine)
    assert isinstance(server, BatchingServer)
    got = [server.submit(p) for p in prompts]
    for r in got:
        assert r.done.wait(30) and r.error is None
    server.close()
    assert [r.tokens for r in got] == [r.tokens for r in expected]

    cfg = OmegaConf.create({"concurrency": [1], "warmup_requests": 2, "warmup_s": 0.0, "min_requests": 10,
                            "min_duration_s": 0.0, "max_duration_s": 60.0, "request_timeout_s": 30.0})
    wl = Workload(prompts, prompts[:2])
    # dynamic: a lone request waits for the window (20 ms), then runs
    q = run_benchmark(dyn_engine, wl, cfg).levels[0].stats["queue_ms"].p50.value
    assert 15 <= q <= 120
    # static: a lone request waits for the full batch until its timeout (150 ms)
    static_engine = build_engine(Batching("static", 4, 150).apply(ort), 2, SHARED_CACHE / "artefacts")
    q = run_benchmark(static_engine, wl, cfg).levels[0].stats["queue_ms"].p50.value
    assert 140 <= q <= 400
