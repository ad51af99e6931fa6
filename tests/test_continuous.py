"""Continuous batching over a paged KV cache (transformers' manager driving the torch model), for real."""
import math
import time

import pytest
from serving_requests import prompt, wait

from experiments.core.recipe import Candidate, Env, Recipe
from experiments.core.request import Prompt
from experiments.serving import refusal
from experiments.serving.backends.pytorch.causal_lm import TorchEngine
from experiments.serving.continuous import ContinuousServer
from experiments.serving.servers import serve
from optimizers.batching import Batching
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.prefix_caching import PrefixCaching

BLOCK = 16


@pytest.fixture(scope="module")
def engine(tiny_target):
    return TorchEngine(Candidate(tiny_target), threads=2)


@pytest.fixture
def server(engine):
    srv = ContinuousServer(engine, max_batch_tokens=256, kv_block_size=BLOCK, kv_num_blocks=64,
                           prefix_caching=False)
    yield srv
    srv.close()


def test_a_new_request_joins_the_running_batch_at_the_next_step(server):
    long = server.submit(prompt(0, 16, 60))
    while len(long.token_times) < 5:
        time.sleep(0.001)
    late = server.submit(prompt(1, 16, 4, start=50))
    wait(late)
    wait(long)
    # It did not wait for the long request to finish: its first token came within a couple of steps.
    assert late.token_times[0] < long.token_times[-1]
    steps_waited = sum(late.sent < t < late.token_times[0] for t in long.token_times)
    assert steps_waited <= 2, f"the late request waited {steps_waited} steps of the running one"
    # And it left at once: the long one went on producing after the short one finished.
    assert sum(t > late.token_times[-1] for t in long.token_times) > 10
    for rec in (long, late):
        assert len(rec.tokens) == rec.prompt.max_new_tokens
        assert rec.engine_start >= rec.arrival
        assert 0 < rec.model_s <= rec.token_times[-1] - rec.arrival


def test_kv_blocks_track_sequence_length_and_are_freed(server):
    assert server.kv_usage() is None or server.kv_usage().blocks_in_use == 0
    rec = server.submit(prompt(0, 40, 60))
    seen = []
    while not rec.done.is_set():
        tokens = len(rec.token_times)          # first: the cache read after it is at least as far on
        usage = server.kv_usage()
        if usage is not None and tokens:
            seen.append((tokens, usage.blocks_in_use))
        time.sleep(0.002)
    wait(rec)
    # Once the manager has finished the request it frees its blocks, before the record's last token and done
    # flag land (CI saw (59 tokens, 0 blocks)): a request with tokens holds blocks until then, so zero = freed.
    seen = [(tokens, blocks) for tokens, blocks in seen if blocks > 0]
    assert seen, "no KV usage sampled while the request ran"
    # Every sample holds about the blocks its tokens need (one ahead at most). Where the samples span two
    # block boundaries, the cache grew; the sampling thread may be starved on a busy machine, so the span
    # is not asserted: each sample is.
    for tokens, blocks in seen:
        assert math.ceil((40 + tokens - 1) / BLOCK) <= blocks <= math.ceil((40 + tokens) / BLOCK) + 1, seen
    (tokens_early, blocks_early), (tokens_late, blocks_late) = seen[0], seen[-1]
    if tokens_late - tokens_early >= 2 * BLOCK:
        assert blocks_late > blocks_early, seen
    deadline = time.time() + 5
    while server.kv_usage().blocks_in_use and time.time() < deadline:
        time.sleep(0.01)
    usage = server.kv_usage()
    assert usage.blocks_in_use == 0 and usage.blocks_total == 64
    assert usage.bytes_per_block == 2 * 4 * BLOCK * 3 * 64 * 4   # K and V, 4 layers, 3 heads x 64, fp32


def test_greedy_tokens_match_the_sequential_engine(engine):
    prompts = [prompt(i, n, 12, start=7 * i + 3) for i, n in enumerate((16, 48, 96))]
    expected = [[tok for tok, _ in engine.generate(list(p.token_ids), p.max_new_tokens)] for p in prompts]
    # The manager switches the shared model to paged attention while it serves: build it after the reference.
    srv = ContinuousServer(engine, max_batch_tokens=256, kv_block_size=BLOCK, kv_num_blocks=64,
                           prefix_caching=False)
    try:
        recs = [srv.submit(p) for p in prompts]
        for rec, want in zip(recs, expected):
            wait(rec)
            assert rec.tokens == want
    finally:
        srv.close()


def test_prefix_caching_reuses_the_blocks_of_a_shared_prefix(engine):
    srv = ContinuousServer(engine, max_batch_tokens=256, kv_block_size=BLOCK, kv_num_blocks=64,
                           prefix_caching=True)
    try:
        shared = tuple(range(100, 164))                        # 4 full blocks
        first = srv.submit(Prompt(0, shared + (7, 8, 9), 4))
        wait(first)
        second = srv.submit(Prompt(1, shared + (11, 12), 4))
        wait(second)
        cache = srv._manager.batch_processor.cache
        assert cache.use_prefix_sharing and cache._total_prefix_length >= len(shared)
    finally:
        srv.close()


def test_the_engine_returns_to_plain_attention_after_the_server(engine):
    srv = ContinuousServer(engine, 128, BLOCK, 32, False)
    srv.close()
    assert not engine.model.config._attn_implementation.startswith("paged")


def test_continuous_rung_selects_torch_on_cpu_and_paged_ort_on_cuda(tiny_target):
    cpu, gpu = Env(False, None, 2), Env(True, (9, 0), 16)
    rung = Batching("continuous", max_batch=32, kv_block_size=16, kv_num_blocks=256, max_tokens_per_step=512)
    ort_cpu = OnnxRuntimeSwap().apply(Candidate(tiny_target))
    assert rung.check(cpu, ort_cpu) is None
    assert rung.apply(ort_cpu).recipe.engine == "torch"
    ort_gpu = OnnxRuntimeSwap().apply(Candidate(tiny_target, Recipe(execution_provider="cuda")))
    assert "CUDA" in rung.check(cpu, ort_gpu)
    assert rung.check(gpu, ort_gpu) is None
    paged = rung.apply(ort_gpu).recipe
    assert (paged.engine, paged.precision, paged.kv_num_blocks) == ("onnxruntime", "fp16", 256)
    # the engine, not the rung, knows its limits: PagedAttention keeps a bf16 champion's bf16, refuses fp32,
    # and onnxruntime-genai's CPU Engine refuses continuous batching outright
    assert rung.apply(ort_gpu.edited("x", precision="bf16")).recipe.precision == "bf16"
    assert "fp16 or bf16" in refusal(ort_gpu.edited("x", batching="continuous", kv_block_size=16, kv_num_blocks=8))
    assert "statically" in refusal(ort_cpu.edited("x", batching="continuous", kv_block_size=16, kv_num_blocks=8))
    assert "paged KV cache" in PrefixCaching().check(cpu, ort_cpu)
    assert PrefixCaching().check(cpu, rung.apply(ort_cpu)) is None
    assert "no prefix sharing" in PrefixCaching().check(gpu, rung.apply(ort_gpu))


def test_serve_picks_the_continuous_server_for_a_continuous_torch_recipe(tiny_target):
    rung = Batching("continuous", max_batch=8, kv_block_size=16, kv_num_blocks=32, max_tokens_per_step=128)
    engine = TorchEngine(rung.apply(Candidate(tiny_target)), threads=2)
    srv = serve(engine)
    try:
        assert isinstance(srv, ContinuousServer)
        rec = srv.submit(prompt(0, 16, 3))
        wait(rec)
    finally:
        srv.close()
