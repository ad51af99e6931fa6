"""The CUDA Graph engine's decode loop, on CPU: capture is simulated by rerunning the recorded step into the same
output tensor, which is what a replay does. What it proves here: one static cache for the engine's life, reset
in place per request, positions advanced on the device, and greedy tokens equal to the eager engine's. On a GPU
the same code records a real torch.cuda.CUDAGraph (make bench-gpu)."""
import types

import pytest

from experiments.core.recipe import Candidate, Recipe
from experiments.serving import build_engine
from experiments.serving.backends.pytorch import cuda_graph as cuda_graph_engine


def replaying_capture(step):
    out = step()
    return out, types.SimpleNamespace(replay=lambda: out.copy_(step()), reset=lambda: None)


@pytest.fixture
def engines(monkeypatch, tiny_target, tmp_path):
    monkeypatch.setattr(cuda_graph_engine, "capture", replaying_capture)
    graphed = build_engine(Candidate(tiny_target, Recipe(cuda_graph=True)), 1, tmp_path)
    eager = build_engine(Candidate(tiny_target, Recipe()), 1, tmp_path)
    return graphed, eager


def test_the_graphed_decode_gives_the_eager_tokens_over_one_static_cache(engines):
    graphed, eager = engines
    assert isinstance(graphed, cuda_graph_engine.CudaGraphEngine)
    cache = graphed.cache
    keys = cache.layers[0].keys.data_ptr()
    for prompt, n in (([5, 17, 99, 3], 12), (list(range(40, 90)), 20), ([7], 5)):
        assert [t for t, _ in graphed.generate(prompt, n)] == [t for t, _ in eager.generate(prompt, n)]
    assert graphed.cache is cache and cache.layers[0].keys.data_ptr() == keys   # allocated once, never moved


def test_a_request_longer_than_the_static_cache_is_refused(engines):
    graphed, _ = engines
    with pytest.raises(ValueError, match="exceed the static cache"):
        next(graphed.generate([1] * graphed.max_len, 1))


def test_without_cuda_the_capture_refuses():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        cuda_graph_engine.capture(lambda: None)
