"""The server_batching rung without a server: a serving champion's continuous batch sized to the load's peak,
what it aims at on each engine, what it skips and why, and the flags it becomes."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from experiments.climb.validation import rung_from
from experiments.core.errors import ConfigError
from experiments.core.recipe import Candidate, Env, Recipe, Target
from experiments.serving.backends.llama_cpp.causal_lm import command as llama_command
from experiments.serving.backends.vllm.causal_lm import command as vllm_command
from optimizers.server_batching import ServerBatching
from optimizers.serving_engine import ServingEngineSwap

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)


def served(engine: str, seqs: int) -> Candidate:
    base = Candidate(Target("m", "causal-lm", Path("/models/m")), Recipe(), ("baseline",))
    return ServingEngineSwap(engine, max_num_seqs=seqs).apply(base)


def champion(*concurrency: int):
    levels = [SimpleNamespace(concurrency=c, offered_qps=None, server_metrics=None) for c in concurrency]
    return SimpleNamespace(bench=SimpleNamespace(levels=levels))


def open_loop(*levels: tuple[float, float, dict | None]):
    """(offered rate, achieved rate, the server's /metrics summary) per level."""
    return SimpleNamespace(bench=SimpleNamespace(levels=[
        SimpleNamespace(concurrency=round(rate), offered_qps=rate, qps=got, server_metrics=metrics)
        for rate, got, metrics in levels]))


def flags(args: list[str]) -> dict:
    return {a: b for a, b in zip(args, args[1:] + ["--"]) if a.startswith("--")}


def sized(rung: ServerBatching, cand: Candidate, seen) -> tuple[str | None, Candidate | None]:
    rung.observe(seen)
    reason = rung.check(CPU, cand)
    return reason, None if reason else rung.apply(cand)


def test_llama_cpp_slots_shrink_to_the_loads_peak_and_aim_at_memory():
    rung, llama = ServerBatching(), served("llama.cpp", 8)
    reason, cand = sized(rung, llama, champion(1, 4))
    assert reason is None and cand.recipe.max_batch == 4 and cand.rungs[-1] == "server_batching"
    assert rung.aim_for(cand) == "memory"                      # each slot's KV cache is allocated at start-up
    assert rung.decision == "the load peaks at 4 requests in flight: llama.cpp's batch 8 -> 4 requests at once"
    args = llama_command(cand, Path("llama-server"), Path("m.gguf"), 2, 8192)
    assert args[args.index("--parallel") + 1] == "4" and args[args.index("-c") + 1] == str(2048 * 4)
    # more slots than the champion's: a speed gain sought
    reason, grown = sized(rung, llama, champion(1, 16))
    assert reason is None and grown.recipe.max_batch == 16 and rung.aim_for(grown) == "speed"


def test_vllm_grows_its_batch_to_the_load_and_never_shrinks_it_for_nothing():
    rung, vllm = ServerBatching(), served("vllm", 16)
    reason, _ = sized(rung, vllm, champion(1, 4))
    assert "fixed budget" in reason and "saving no memory" in reason
    reason, cand = sized(rung, vllm, champion(1, 8, 32))
    assert reason is None and rung.aim_for(cand) == "speed"
    assert flags(vllm_command(cand, "py"))["--max-num-seqs"] == "32"
    # tokens a step (vLLM's chunked prefill's chunk) is a change worth measuring; the batch still never shrinks
    rung = ServerBatching(max_num_batched_tokens=256)
    reason, cand = sized(rung, vllm, champion(1, 4))
    assert reason is None and rung.aim_for(cand) == "speed" and cand.recipe.max_batch == 16
    assert flags(vllm_command(cand, "py"))["--max-num-batched-tokens"] == "256"
    assert "vllm's batch stays 16 requests at once, default -> 256 tokens a step" in rung.decision


def test_tokens_a_step_become_llama_servers_batch_sizes():
    rung = ServerBatching(max_num_seqs=8, max_num_batched_tokens=256)
    reason, cand = sized(rung, served("llama.cpp", 8), champion(1, 4))
    assert reason is None and "max_num_seqs is set to 8" in rung.decision
    got = flags(llama_command(cand, Path("llama-server"), Path("m.gguf"), 2, 8192))
    assert got["--batch-size"] == "256" and got["--ubatch-size"] == "256"
    assert "--batch-size" not in llama_command(served("llama.cpp", 8), Path("s"), Path("m"), 2, 8192)


def test_what_it_does_not_apply_to_is_skipped_with_the_reason():
    rung = ServerBatching()
    in_process = Candidate(Target("m", "causal-lm", Path("/models/m")), Recipe(engine="onnxruntime"), ("baseline",))
    assert "in process: its batching rungs are static, dynamic and continuous_batching" in \
        sized(rung, in_process, champion(1, 4))[0]
    assert "already runs 4 requests at once (the load's peak)" in sized(rung, served("llama.cpp", 4), champion(1, 4))[0]
    assert "no load ladder" in sized(rung, served("llama.cpp", 8), None)[0]
    with pytest.raises(ValueError, match="no load ladder"):
        rung.apply(served("llama.cpp", 8))


def test_an_open_loop_peak_is_what_the_server_held_at_once_at_levels_it_kept_up_with():
    rung = ServerBatching()
    # the most in flight at once over the levels served at their rate; the saturated level's queue is left out
    load = open_loop((2.0, 2.0, {"in_flight_max": 2.0, "running_max": 2.0, "waiting_max": 1.0}),
                     (4.0, 3.95, {"in_flight_max": 3.0, "running_max": 3.0, "waiting_max": 2.0}),
                     (8.0, 5.0, {"in_flight_max": 40.0}))
    reason, cand = sized(rung, served("llama.cpp", 8), load)
    assert reason is None and cand.recipe.max_batch == 3
    reason, _ = sized(rung, served("llama.cpp", 8), open_loop((2.0, 2.0, None), (8.0, 5.0, {"in_flight_max": 40.0})))
    assert "open-loop load whose server reported no requests in flight (/metrics) at a level it kept up" in reason


def test_what_the_sweep_decided_reaches_the_rungs_own_process():
    """observe and check run in the sweep's process; apply and aim_for in the rung's child, on a copy."""
    import pickle

    rung, llama = ServerBatching(), served("llama.cpp", 8)
    rung.observe(champion(1, 4))
    assert rung.check(CPU, llama) is None
    copy = pickle.loads(pickle.dumps(rung))
    cand = copy.apply(llama)
    assert cand.recipe.max_batch == 4 and copy.aim_for(cand) == "memory" and copy.decision == rung.decision


@pytest.mark.parametrize("bad, says", [({"max_num_seqs": "lots"}, "max_num_seqs must be 'peak' or an int"),
                                       ({"max_num_seqs": 0}, "max_num_seqs must be 'peak' or an int"),
                                       ({"max_num_batched_tokens": -1}, "max_num_batched_tokens must be >= 0")])
def test_a_wrong_setting_is_refused_before_any_work(bad, says):
    cfg = OmegaConf.create({"_target_": "optimizers.server_batching.ServerBatching", **bad})
    with pytest.raises(ConfigError, match=says):
        rung_from("server_batching", cfg)
    assert rung_from("server_batching", OmegaConf.load("conf/rung/server_batching.yaml")).max_num_seqs == "peak"


def test_a_fixed_kv_budget_is_never_shrunk_on_the_gpu_servers_either():
    base = Candidate(Target("m", "causal-lm", Path("/models/m")), Recipe(execution_provider="cuda", precision="bf16"))
    for engine in ("sglang", "tensorrt-llm"):
        reason, _ = sized(ServerBatching(), ServingEngineSwap(engine, max_num_seqs=16).apply(base), champion(1, 4))
        assert "fixed budget" in reason, engine


@pytest.mark.parametrize("engine, seqs_flag, tokens_flag",
                         [("sglang", "--max-running-requests", "--chunked-prefill-size"),
                          ("tensorrt-llm", "--max_batch_size", "--max_num_tokens")])
def test_the_gpu_servers_get_the_batch_as_their_own_flags(engine, seqs_flag, tokens_flag):
    """Checked on the command line here (their servers need CUDA); the batch and the tokens a step reach both."""
    from experiments.serving import engine_class

    base = Candidate(Target("m", "causal-lm", Path("/models/m")), Recipe(execution_provider="cuda", precision="bf16"))
    cand = ServerBatching(max_num_seqs=32, max_num_batched_tokens=1024).apply(
        ServingEngineSwap(engine, max_num_seqs=16).apply(base))
    one = ServingEngineSwap(engine, max_num_seqs=1).apply(base)
    made = SimpleNamespace(ensure=lambda home: Path("/env/bin/python"))   # its environment, as if made
    args, _ = engine_class(cand).server_command(SimpleNamespace(environment=lambda: made), cand, 1)
    assert flags(args)[seqs_flag] == "32" and flags(args)[tokens_flag] == "1024"
    args, _ = engine_class(one).server_command(SimpleNamespace(environment=lambda: made), one, 1)
    assert flags(args)[seqs_flag] == "1"       # a batch of one reaches the server, not its default


# --- the engine swaps enter at a batch sized to the load (issue 41) ----------------------------------------------
def swapped(engine: str, seen, **settings) -> tuple[ServingEngineSwap, str | None, Candidate]:
    swap = ServingEngineSwap(engine, **settings)
    base = Candidate(Target("m", "causal-lm", Path("/models/m")), Recipe(engine="onnxruntime"), ("baseline",))
    swap.observe(seen)
    return swap, swap.check(CPU, base), swap.apply(base)


def test_llama_cpp_enters_with_as_many_slots_as_the_load_has_in_flight():
    # at a load of 4, 8 slots served 89 tokens/s where 4 served 122: the swap is judged at the load's size
    swap, reason, cand = swapped("llama.cpp", champion(1, 4), max_num_seqs=8)
    assert reason is None and cand.recipe.max_batch == 4
    assert swap.decision == ("the load peaks at 4 requests in flight (the load ladder's top concurrency): llama.cpp "
                             "enters with 4 slots, each with its own KV cache")
    args = llama_command(cand, Path("llama-server"), Path("m.gguf"), 2, 8192)
    assert args[args.index("--parallel") + 1] == "4"
    assert swapped("llama.cpp", champion(1, 4, 16), max_num_seqs=4)[2].recipe.max_batch == 16
    # the batch sized where the swap's candidate is made, also in the rung's own process (a pickled copy)
    import pickle
    assert pickle.loads(pickle.dumps(swap)).apply(
        Candidate(Target("m", "causal-lm", Path("/models/m")), Recipe(), ("baseline",))).recipe.max_batch == 4


def test_vllm_keeps_its_batch_unless_the_load_exceeds_it():
    swap, reason, cand = swapped("vllm", champion(1, 4), max_num_seqs=16)
    assert reason is None and cand.recipe.max_batch == 16       # a fixed KV budget: fewer would save nothing
    assert "whose KV pool is a fixed budget, keeps its batch of 16" in swap.decision
    swap, _, cand = swapped("vllm", champion(1, 32), max_num_seqs=16)
    assert cand.recipe.max_batch == 32 and "grows its batch of 32" in swap.decision


def test_a_swap_without_a_measured_load_or_told_not_to_size_keeps_its_setting():
    swap, reason, cand = swapped("llama.cpp", None, max_num_seqs=4)
    assert reason is None and cand.recipe.max_batch == 4 and "no load was measured" in swap.decision
    swap, _, cand = swapped("llama.cpp", champion(1, 16), max_num_seqs=4, size_to_load=False)
    assert cand.recipe.max_batch == 4 and "size_to_load=false" in swap.decision


def test_the_ladders_llama_cpp_and_vllm_rungs_size_to_the_load():
    from conftest import compose

    cfg = compose(["ladder=serving"])
    for name in ("llama_cpp", "vllm"):
        assert rung_from(name, cfg.ladder.rungs[name]).size_to_load
    assert rung_from("llama_cpp", cfg.ladder.rungs.llama_cpp).max_num_seqs == 4     # llama-server's own default
