"""Bottleneck diagnosis: the curve-shape rules on synthetic samples (known answers), the queue/model split, the
recommended next rung, the decode-step profile of the real tiny model, and what distillation takes from it."""
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from experiments.analyse.diagnose import default_rules, diagnose, recommend, resource_layer
from experiments.analyse.profiling import ort_ops, profile_decode
from experiments.analyse.roofline import Hardware, ModelShape, Roofline
from experiments.core.reports import ResourceSeries
from experiments.measure.load_ladder import run_benchmark

RULES = default_rules()
TINY = ModelShape(layers=4, hidden=192, intermediate=512, heads=3, kv_heads=3, head_dim=64, vocab=2048,
                  tied_embeddings=True)


def series(cpu, gpu=(), gpu_mem=(), total=None, cores=2, host_mem=50.0):
    return ResourceSeries(0.25, tuple(map(float, cpu)), (100.0,) * len(cpu), (host_mem,) * len(cpu),
                          tuple(map(float, gpu)), tuple(map(float, gpu_mem)), total, cores,
                          "" if gpu else "no CUDA device: GPU sampling not applicable here")


def level(c, qps, e2e, queue, model, resources=None):
    stat = lambda v: SimpleNamespace(mean=float(v))  # noqa: E731
    return SimpleNamespace(concurrency=c, qps=qps, resources=resources,
                           stats={"e2e_ms": stat(e2e), "queue_ms": stat(queue), "model_ms": stat(model)})


def bench(*levels):
    return SimpleNamespace(levels=tuple(levels), slos=(), capacity=None)


def status(levels, rule):
    return resource_layer(levels, RULES.resource).get(rule)


# --- resource layer: each row of the table, on samples whose answer is known --------------------------------
def test_low_accelerator_and_high_cpu_points_at_cpu_side_work():
    lv = level(1, 10, 100, 1, 40, series([170] * 8, gpu=[15] * 8, gpu_mem=[1000] * 8, total=80000))
    f = status([lv], "cpu_side")
    assert f.status == "fired" and f.levels == (1,) and "GPU 15 %, CPU 85%" in f.evidence
    d = diagnose(bench(lv), rules=RULES)
    assert d.bottleneck == "cpu_side" and d.next_rung == "none" and "pre/post-processing" in d.next_reason


def test_cpu_only_run_says_what_applies():
    lv = level(1, 10, 100, 1, 95, series([190, 195, 188, 192, 190, 191]))
    layer = resource_layer([lv], RULES.resource)
    assert layer.get("cpu_saturated").status == "fired" and "compute-bound on the CPU" in layer.get(
        "cpu_saturated").direction
    assert layer.get("cpu_side").status == "not applicable" and "no CUDA device" in layer.get("cpu_side").evidence
    assert layer.get("accel_busy").status == "not applicable"
    assert layer.get("bandwidth").status == "not sampled" and layer.get("interconnect").status == "not sampled"
    assert layer.get("swinging").status == "clear" and layer.get("memory_capacity").status == "clear"
    assert "| CPU saturated across cores at low concurrency | fired | c=1 |" in layer.to_markdown()


def test_saturated_cores_only_count_at_low_concurrency():
    assert status([level(8, 10, 100, 1, 95, series([195] * 6))], "cpu_saturated").status == "clear"
    assert status([level(1, 10, 100, 1, 95, series([120] * 6))], "cpu_saturated").status == "clear"


def test_swinging_utilisation_points_at_queueing_or_batch_window():
    swing = level(4, 10, 100, 50, 40, series([20, 180, 20, 180, 20, 180]))
    assert status([swing], "swinging").status == "fired" and "CV 0.80" in status([swing], "swinging").evidence
    steady = level(4, 10, 100, 50, 40, series([100, 104, 98, 101, 99, 100]))
    assert status([steady], "swinging").status == "clear"
    idle = level(4, 10, 100, 50, 40, series([0, 5, 0, 5, 0, 5]))      # mean under swing_min_mean: no swing
    assert status([idle], "swinging").status == "clear"


def test_flat_throughput_with_growing_latency_is_saturation():
    lv1, lv2 = level(1, 20.0, 50, 1, 45), level(2, 20.5, 98, 48, 45)
    f = status([lv1, lv2], "saturation")
    assert f.status == "fired" and f.levels == (1,) and f.evidence == "c=1→2: throughput ×1.02, mean E2E ×1.96"
    scaling = [level(1, 20.0, 50, 1, 45), level(2, 38.0, 53, 2, 46)]
    assert status(scaling, "saturation").status == "clear"
    assert status([lv1], "saturation").status == "not sampled"


def test_low_accelerator_with_memory_near_full_is_capacity():
    lv = level(4, 10, 100, 10, 80, series([50] * 6, gpu=[20] * 6, gpu_mem=[76000] * 6, total=80000))
    assert status([lv], "memory_capacity").status == "fired"
    d = diagnose(bench(lv), rules=RULES)
    assert d.bottleneck == "memory_capacity" and d.next_rung == "int8"
    busy = level(4, 10, 100, 10, 80, series([50] * 6, gpu=[95] * 6, gpu_mem=[30000] * 6, total=80000))
    assert status([busy], "accel_busy").status == "fired" and status([busy], "memory_capacity").status == "clear"


def test_too_few_samples_are_not_read_as_a_shape():
    layer = resource_layer([level(1, 10, 100, 1, 95, series([195, 195]))], RULES.resource)
    assert {f.status for f in layer.findings} == {"not sampled"}
    assert "fewer than 4 resource samples" in layer.get("cpu_saturated").evidence


# --- combining the layers: the bottleneck and the next rung -------------------------------------------------
def test_queueing_recommends_batching_then_the_next_one_not_yet_applied_or_turned_down():
    b = bench(level(1, 20, 50, 1, 45), level(4, 20, 200, 150, 45))
    d = diagnose(b, rules=RULES)
    assert d.bottleneck == "queueing" and d.next_rung == "dynamic_batching"
    assert "queueing is 75% of mean E2E at c=4" in d.tag and "throughput flat while latency grows (c=1→4" in d.tag
    assert diagnose(b, rules=RULES, applied=("baseline", "dynamic_batching")).next_rung == "continuous_batching"
    d = diagnose(b, rules=RULES, tried={"dynamic_batching": "rejected", "continuous_batching": "skipped"})
    assert d.next_rung == "static_batching" and "dynamic_batching: rejected in this sweep" in d.next_reason
    d = diagnose(b, rules=RULES, ladder=["baseline", "onnxruntime"])     # a known rung outside this ladder
    assert d.next_rung == "dynamic_batching" and "not in this ladder: add `/rung@rungs.dynamic_batching" in d.next_reason
    d = diagnose(b, rules=RULES, tried=dict.fromkeys(["dynamic_batching", "continuous_batching", "static_batching",
                                                      "server_batching"], "rejected"))
    assert d.next_rung == "none" and "capacity plan" in d.next_reason
    tags = d.tags()
    assert tags["roi.recommended_next_rung"] == "none" and tags["roi.diagnosis"].startswith("queueing: ")


def test_the_model_layer_is_placed_on_the_roofline():
    b = bench(level(1, 20, 50, 0.5, 45))            # engine compute is 90 % of E2E
    big_cache = Hardware("cpu", 1e11, 1e10, cache_bytes=64e6)
    no_cache = Hardware("cpu", 1e11, 1e10, cache_bytes=None)
    in_cache = Roofline.analyse(TINY, big_cache, 4, 4, prefill_tokens=96, decode_batch=1, context=160)
    d = diagnose(b, in_cache, RULES, applied=("baseline",))
    assert d.bottleneck == "overhead" and d.next_rung == "onnxruntime" and "fits in cache" in d.summary
    dram = Roofline.analyse(TINY, no_cache, 4, 4, prefill_tokens=96, decode_batch=1, context=160)
    assert diagnose(b, dram, RULES).bottleneck == "memory_bound"
    assert diagnose(b, dram, RULES).next_rung == "int8"
    compute = Roofline.analyse(TINY, Hardware("slow", 1e8, 1e12), 4, 4, prefill_tokens=96, decode_batch=8,
                               context=160)
    assert diagnose(b, compute, RULES).bottleneck == "compute_bound"
    assert diagnose(b, None, RULES).next_rung == "distillation"
    outside = bench(level(1, 20, 50, 0.5, 10))
    assert diagnose(outside, in_cache, RULES).bottleneck == "outside_engine"
    # no share above its threshold: the largest one decides (here the model, by a hair)
    even = bench(level(2, 20, 100, 49.5, 50))
    assert diagnose(even, in_cache, RULES).bottleneck == "overhead"
    assert diagnose(bench(level(2, 20, 100, 45, 40)), in_cache, RULES).bottleneck == "queueing"


def test_markdown_and_metrics_carry_the_split():
    d = diagnose(bench(level(1, 20, 50, 1, 45), level(2, 20, 100, 50, 45)), rules=RULES)
    md = d.to_markdown()
    assert "| 2 | 50% | 45% | 5% | 100.0 |" in md and "Recommended next rung" in md and "curve-shape" in md
    assert d.to_metrics()["diagnosis/queue_share_c2"] == pytest.approx(0.5)


def test_a_real_benchmark_records_samples_and_diagnoses_queueing():
    from test_benchmark import ScriptedEngine, workload

    cfg = OmegaConf.create({"concurrency": [1, 3], "warmup_requests": 2, "warmup_s": 0.0, "min_requests": 12,
                            "min_duration_s": 1.5, "max_duration_s": 30.0, "request_timeout_s": 5.0})
    report = run_benchmark(ScriptedEngine(), workload(200), cfg)
    s = report.level(1).resources
    assert len(s.cpu_percent) >= 4 and len(s.rss_mb) == len(s.cpu_percent) and s.cpu_count >= 1
    d = diagnose(report, rules=RULES)
    assert d.bottleneck == "queueing" and d.next_rung == "dynamic_batching"      # one at a time, 3 clients
    assert d.resources.get("saturation").status == "fired"
    assert d.resources.get("cpu_saturated").status == "clear"                   # a sleeping engine


# --- framework layer: the decode step of the real tiny model ------------------------------------------------
@pytest.mark.parametrize("engine_name", ["torch", "onnxruntime"])
def test_decode_step_profile_of_the_tiny_model(tiny_target, engine_name):
    from conftest import SHARED_CACHE

    from experiments.core.recipe import Candidate
    from experiments.serving import build_engine

    engine = build_engine(Candidate(tiny_target).edited("x", engine=engine_name), 1, SHARED_CACHE / "artefacts")
    try:
        prof = profile_decode(engine, list(range(5, 53)), 8)
    finally:
        engine.close()
    names = [o.op for o in prof.ops]
    matmul = "aten::mm" if engine_name == "torch" else "MatMul"
    assert matmul in names[:3], names[:6]               # a decode step is mostly its linear layers
    assert prof.steps == 8 and prof.step_ms > 0 and prof.total_ms > 0
    assert all(a.self_ms >= b.self_ms for a, b in zip(prof.ops, prof.ops[1:]))
    md = prof.to_markdown(5)
    assert md.count("\n| ") == 6 and f"`{matmul}`" in md and "8 decode steps" in md
    if engine_name == "onnxruntime":   # 4 layers x (q, k, v / qkv, o, gate, up, down) + lm_head: per step
        assert next(o for o in prof.ops if o.op == "MatMul").calls % 8 == 0


def test_ort_trace_keeps_only_the_last_runs():
    def node(ts, op, dur):
        return {"cat": "Node", "name": f"n_{op}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}
    events = [{"name": "model_run", "ts": 0, "dur": 100}, node(10, "MatMul", 90),              # prefill
              {"name": "model_run", "ts": 200, "dur": 50}, node(210, "MatMul", 30), node(240, "Add", 5),
              {"name": "model_run", "ts": 300, "dur": 50}, node(310, "MatMul", 20)]
    ops = ort_ops(events, steps=2)
    assert [(o.op, o.self_ms, o.calls) for o in ops] == [("MatMul", 0.05, 2), ("Add", 0.005, 1)]


# --- distillation takes the resource layer into its "is the model the bottleneck?" -------------------------
def test_distillation_skips_when_the_resource_layer_points_elsewhere(tiny_target):
    from dataclasses import asdict

    from experiments.core.recipe import Candidate, Env
    from experiments.core.slo import SLO
    from experiments.targets.models.student import DistillSettings
    from optimizers.distillation import Distillation

    quick = DistillSettings(2, 10, 64, 4, 1e-3, 2.0, 0.9, 0)
    opt = Distillation(**asdict(quick), threads=2, cache_dir="/unused", stdlib_heldout_every=8,
                       accuracy_tasks=["tiny_llm_nextline"])
    opt.name = "distillation"
    swinging = series([20, 180, 20, 180, 20, 180])
    hot = SimpleNamespace(levels=(level(1, 20, 10, 0.5, 9.5, swinging), level(8, 20, 40, 2, 36, swinging)),
                          slos=(SLO.parse("p95_e2e_ms<=20"),), capacity=None)
    for lv in hot.levels:
        lv.values = lambda metric, lv=lv: __import__("numpy").full(50, lv.stats["e2e_ms"].mean)
    opt.observe(SimpleNamespace(bench=hot))
    reason = opt.check(Env(False, None, 2), Candidate(tiny_target).edited("baseline"))
    assert reason and "not the bottleneck" in reason and "utilisation swinging" in reason and "90%" in reason
    steady = series([190] * 6)
    for lv in hot.levels:
        lv.resources = steady
    opt.observe(SimpleNamespace(bench=hot))
    assert opt.check(Env(False, None, 2), Candidate(tiny_target).edited("baseline")) is None
    assert "model layer is the bottleneck" in opt.decision and "resource layer: CPU saturated" in opt.decision


def test_a_champion_without_a_profiler_here_is_said_so_without_building_it(scratch_run):
    """A llama.cpp champion (a server, its own /metrics logged): the framework profile is "not applicable", tagged,
    and nothing is built, where it was a traceback in the sweep's output."""
    import mlflow

    from experiments.climb.sweep_report import _profile_champion

    recipe = SimpleNamespace(engine="llama.cpp")
    champion = SimpleNamespace(name="int8", candidate=SimpleNamespace(recipe=recipe,
                                                                      target=SimpleNamespace(kind="causal-lm")))
    assert _profile_champion(champion, SimpleNamespace(cfg=None)) is None
    tags = mlflow.get_run(scratch_run.info.run_id).data.tags
    assert tags["roi.diagnosis.framework_profile"] == ("not applicable: no framework profiler for llama.cpp here "
                                                       "(profiled: torch, onnxruntime)")


def test_a_rung_that_does_not_apply_to_the_champion_is_not_recommended():
    """A llama.cpp server at saturation batches in its own slots: the recommendation passes over dynamic and
    continuous batching with the rungs' own reasons and says what is left, instead of naming a rung the ladder
    would skip."""
    from functools import partial
    from pathlib import Path

    from experiments.climb.sweep_report import _refusal, _rung_named
    from experiments.core.recipe import Candidate, Env, Target
    from experiments.judge.gate import Verdict
    from experiments.record.outcome import RungOutcome
    from optimizers.baseline import EagerBaseline
    from optimizers.serving_engine import ServingEngineSwap

    def measured(cand, *concurrency):
        levels = [SimpleNamespace(concurrency=c, offered_qps=None, server_metrics=None) for c in concurrency]
        return RungOutcome(cand.rungs[-1], Verdict("accepted", ""), cand, SimpleNamespace(levels=levels))

    base = EagerBaseline().apply(Candidate(Target("t", "causal-lm", Path("/x"))))
    server = ServingEngineSwap("llama.cpp", max_num_seqs=8).apply(base)
    cpu = Env(cuda=False, cuda_capability=None, cpu_count=2)
    table = {"saturation": ["dynamic_batching", "continuous_batching", "server_batching"]}
    rung_named = partial(_rung_named, {})
    as_listed = _refusal(measured(server, 1, 8), cpu, rung_named)
    rung, reason = recommend("saturation", "flat", table, server.rungs, {}, refusal=as_listed)
    assert rung == "none", reason
    assert "dynamic_batching: does not apply (the champion already uses continuous batching)" in reason
    assert "server_batching: does not apply (the champion's llama.cpp server already runs 8 requests at once " \
           "(the load's peak))" in reason
    # the server's own batch, where the load sends more than its slots hold: asked after seeing this champion
    rung, reason = recommend("saturation", "flat", table, server.rungs, {},
                             refusal=_refusal(measured(server, 1, 16), cpu, rung_named))
    assert rung == "server_batching", reason
    in_process = recommend("saturation", "flat", table, base.rungs, {},
                           refusal=_refusal(measured(base, 1, 8), cpu, rung_named))[0]
    assert in_process not in ("none", "server_batching"), in_process
    # the rung as this sweep's ladder configures it, not conf/rung's: a setting it cannot be built with rules
    # nothing out (a recommendation, not a verdict)
    from omegaconf import OmegaConf
    odd = {"dynamic_batching": OmegaConf.create({"_target_": "optimizers.batching.Batching", "kind": "dynamic",
                                                 "max_batch": 0})}
    as_odd = _refusal(measured(server, 1, 8), cpu, partial(_rung_named, odd))
    assert recommend("saturation", "flat", table, server.rungs, {}, refusal=as_odd)[0] == "dynamic_batching"
