"""Our own iteration-level scheduler over the torch model (left-padded batched KV cache), for real."""
import inspect
import json.decoder
import random
import time

import pytest
from conftest import compose
from serving_requests import prompt, wait

from experiments.climb.validation import load_rungs
from experiments.core.errors import ConfigError
from experiments.core.recipe import Candidate, Env
from experiments.core.request import Prompt
from experiments.serving.backends.pytorch.causal_lm import TorchEngine
from experiments.serving.continuous import ContinuousServer
from experiments.serving.iteration import IterationServer
from experiments.serving.servers import serve
from optimizers.batching import Batching
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.prefix_caching import PrefixCaching
from optimizers.torch_compile import TorchCompile

CPU = Env(False, None, 2)


@pytest.fixture(scope="module")
def engine(tiny_target):
    return TorchEngine(Candidate(tiny_target), threads=2)


@pytest.fixture
def server(engine):
    srv = IterationServer(engine, max_batch=8, max_tokens_per_step=512)
    yield srv
    srv.close()


# 14 windows of real text (Python source, as the model was trained on) of mixed lengths through a batch of 8:
# 512 tokens/step admits 8 at once (one padded prefill); 100 admits them a few at a time, so sequences of
# different lengths join a running, already padded batch and leave it at different steps.
@pytest.mark.parametrize("budget", [512, 100])
def test_greedy_tokens_match_one_at_a_time_decoding(engine, budget):
    ids = engine.tokenizer.encode(inspect.getsource(json.decoder), add_special_tokens=False)
    rng = random.Random(1)
    shapes = [(16, 12), (48, 30), (96, 20), (5, 40), (33, 7), (70, 1), (1, 25)] * 2
    prompts = []
    for i, (n, out) in enumerate(shapes):
        start = rng.randrange(0, len(ids) - n)
        prompts.append(Prompt(i, tuple(ids[start:start + n]), out))
    expected = [[tok for tok, _ in engine.generate(list(p.token_ids), p.max_new_tokens)] for p in prompts]
    srv = IterationServer(engine, max_batch=8, max_tokens_per_step=budget)
    try:
        recs = [srv.submit(p) for p in prompts]
        for rec, want in zip(recs, expected):
            wait(rec)
            assert rec.tokens == want, f"prompt of {len(rec.prompt.token_ids)} tokens"
    finally:
        srv.close()


def test_a_new_request_joins_the_running_batch_at_the_next_step(server):
    long = server.submit(prompt(0, 16, 60))
    while len(long.token_times) < 5:
        time.sleep(0.001)
    late = server.submit(prompt(1, 16, 4, start=50))
    wait(late)
    wait(long)
    assert late.token_times[0] < long.token_times[-1]
    steps_waited = sum(late.sent < t < late.token_times[0] for t in long.token_times)
    assert steps_waited <= 2, f"the late request waited {steps_waited} steps of the running one"
    assert sum(t > late.token_times[-1] for t in long.token_times) > 10


def test_a_finished_sequence_leaves_at_once_with_its_times_filled(server):
    long, short = server.submit(prompt(0, 40, 150)), server.submit(prompt(1, 8, 5, start=60))
    wait(short)
    # done is set after the rows were dropped: the batch is down to the long one, which is still going
    assert server.running == 1 and not long.done.is_set()
    assert server.kv_usage().mb_in_use > 0
    wait(long)
    deadline = time.time() + 5
    while server.running and time.time() < deadline:
        time.sleep(0.01)
    assert server.running == 0 and server.kv_usage().mb_in_use == 0
    for rec in (long, short):
        t = rec.token_times
        assert len(t) == len(rec.tokens) == rec.prompt.max_new_tokens
        assert t == sorted(t) and rec.arrival <= rec.engine_start <= t[0]
        assert 0 < rec.model_s <= t[-1] - rec.arrival
    assert short.model_s < long.model_s
    # the short one's last token came from the step in which it left, long before the long one ended
    assert short.token_times[-1] < long.token_times[10]


def test_a_failed_step_fails_its_requests_and_the_server_goes_on(engine, server):
    bad = server.submit(Prompt(0, (5, 6, 10**6), 4))           # id far outside the vocabulary
    assert bad.done.wait(60) and bad.error and "Error" in bad.error
    good = server.submit(prompt(1, 16, 6))
    wait(good)
    assert good.tokens == [tok for tok, _ in engine.generate(list(good.prompt.token_ids), 6)]


def test_a_failure_outside_the_forward_fails_the_batch_not_the_thread(server):
    def boom(*args):
        raise RuntimeError("re-padding failed")

    server._join = boom                                          # newcomers cannot join the batch
    failed = server.submit(prompt(0, 16, 6))
    assert failed.done.wait(60) and failed.error == "RuntimeError: re-padding failed"
    assert server.running == 0
    del server._join
    wait(server.submit(prompt(1, 16, 6)))


def test_the_recipe_selects_the_scheduler(tiny_target):
    ort = OnnxRuntimeSwap().apply(Candidate(tiny_target))
    own = Batching("continuous", max_batch=8, max_tokens_per_step=128, scheduler="own")
    assert own.check(CPU, ort) is None                          # kv_num_blocks 0 is fine: no blocks here
    cand = own.apply(ort)
    assert (cand.recipe.engine, cand.recipe.scheduler) == ("torch", "own")
    assert cand.describe()["scheduler"] == "own"
    assert "no blocks to share" in PrefixCaching().check(CPU, cand)
    assert "own continuous scheduler" in TorchCompile().check(CPU, cand)
    paged = Batching("continuous", max_batch=8, kv_num_blocks=32, max_tokens_per_step=128).apply(ort)
    assert paged.recipe.scheduler == "transformers" and PrefixCaching().check(CPU, paged) is None
    for c, kind in ((cand, IterationServer), (paged, ContinuousServer)):
        srv = serve(TorchEngine(c, threads=2))
        try:
            assert isinstance(srv, kind)
            wait(srv.submit(prompt(0, 16, 3)))
        finally:
            srv.close()


def test_the_default_ladder_uses_the_own_scheduler(tmp_path):
    rungs = dict(load_rungs(compose([f"data_dir={tmp_path}"])))
    assert rungs["continuous_batching"].scheduler == "own"


@pytest.mark.parametrize("kwargs", [dict(kind="continuous", scheduler="fast", max_tokens_per_step=64),
                                    dict(kind="dynamic", scheduler="own"),
                                    dict(kind="continuous", scheduler="own", max_tokens_per_step=0)])
def test_bad_scheduler_parameters_are_one_clear_error(kwargs):
    with pytest.raises(ValueError, match="scheduler"):
        Batching(max_batch=8, **kwargs)


def test_a_bad_scheduler_in_yaml_is_one_clear_error(tmp_path):
    cfg = compose([f"data_dir={tmp_path}", "ladder.rungs.continuous_batching.scheduler=fast"])
    with pytest.raises(ConfigError, match="rung 'continuous_batching' could not be built.*scheduler"):
        load_rungs(cfg)


def test_the_server_refuses_bad_limits(engine):
    with pytest.raises(ValueError, match="max_batch >= 1 and max_tokens_per_step >= 1"):
        IterationServer(engine, max_batch=0, max_tokens_per_step=64)
