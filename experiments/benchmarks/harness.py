"""`make bench` (harness part): is the load generator fast and cheap enough to trust? Ratios in one run.

1. Load-generator ceiling: closed loop against an engine that returns one token at once (goal >= 5,000 req/s).
2. Instrumentation overhead per request on the default model's fastest engine: the same prompts decoded by
   calling the engine directly vs through server + load generator + timestamps (goal < 2 %).
"""
from __future__ import annotations

import statistics
import time

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from experiments.benchmarks.common import default_setup
from experiments.core.names import Metric
from experiments.core.recipe import Env
from experiments.core.request import Prompt
from experiments.measure.load_ladder import run_benchmark
from experiments.record.console import quiet_libraries
from experiments.serving import build_engine
from experiments.serving.engine import Engine
from experiments.targets.workload import Workload
from optimizers.batching import Batching
from optimizers.prefix_caching import PrefixCaching


class NoOpEngine(Engine):
    name = "no-op"

    def generate(self, prompt_ids, max_new_tokens):
        for _ in range(max_new_tokens):
            yield 0, 0.0

    def lm_eval_model(self, batch_size):
        raise NotImplementedError("a no-op engine has no accuracy")

    def artefact_paths(self):
        return []


def load_generator_ceiling(concurrency: int = 16, seconds: float = 3.0) -> float:
    prompts = tuple(Prompt(i, (1, 2, 3), 1) for i in range(1000))
    cfg = OmegaConf.create({"concurrency": [concurrency], "warmup_requests": 200, "warmup_s": 0.0,
                            "min_requests": 1, "min_duration_s": seconds, "max_duration_s": seconds,
                            "request_timeout_s": 10.0})
    level = run_benchmark(NoOpEngine(), Workload(prompts, prompts[:200]), cfg).levels[0]
    return len(level.records) / level.duration_s


def instrumentation_overhead(engine: Engine, workload: Workload, rounds: int = 5) -> tuple[float, float, float]:
    """(direct mean ms, harnessed mean ms, overhead fraction), interleaved rounds so drift hits both."""
    prompts = workload.prompts[:40]
    cfg = OmegaConf.create({"concurrency": [1], "warmup_requests": 0, "warmup_s": 0.0, "min_requests": len(prompts),
                            "min_duration_s": 0.0, "max_duration_s": 600.0, "request_timeout_s": 60.0})
    direct, harnessed = [], []
    for _ in range(rounds):
        for p in prompts:
            t = time.perf_counter()
            for _tok in engine.generate(list(p.token_ids), p.max_new_tokens):
                pass
            direct.append((time.perf_counter() - t) * 1e3)
        level = run_benchmark(engine, Workload(prompts, ()), cfg).levels[0]
        harnessed.extend(level.values(Metric.E2E_MS)[: len(prompts)])
    d, h = statistics.fmean(direct), statistics.fmean(harnessed)
    return d, h, h / d - 1


def batching_comparison(base_candidate, ort_candidate, workload: Workload, threads: int, artefacts,
                        concurrency: int = 16, engines=("onnxruntime", "torch")):
    """Sequential vs static vs dynamic vs continuous batching, same load. onnxruntime-genai batches statically
    on CPU, so continuous batching is compared within the torch engine: transformers' manager (paged KV) and
    our own iteration-level scheduler (left-padded batched KV), same batch and token budget. `engines` picks
    the rows by the engine their label starts with."""
    cfg = _level_cfg(concurrency)
    env = Env.detect()
    continuous = Batching("continuous", 32, kv_block_size=16, kv_num_blocks=1024, max_tokens_per_step=512,
                          scheduler="transformers")
    own = Batching("continuous", 32, max_tokens_per_step=512, scheduler="own")
    rows = {}
    for label, start, rung in (
            ("onnxruntime: one at a time", ort_candidate, None),
            ("onnxruntime: static (B=16, 200 ms)", ort_candidate, Batching("static", 16, 200)),
            ("onnxruntime: dynamic (B=16, 5 ms)", ort_candidate, Batching("dynamic", 16, 5)),
            ("torch: one at a time", base_candidate, None),
            ("torch: continuous (paged KV, 16-token blocks)", ort_candidate, continuous),
            ("torch: continuous (own scheduler, padded KV)", ort_candidate, own)):
        if label.split(":")[0] not in engines:
            continue
        reason = rung.check(env, start) if rung else None
        if reason:
            rows[label] = reason
            continue
        cand = rung.apply(start) if rung else start
        level = run_benchmark(build_engine(cand, threads, artefacts), workload, cfg).levels[0]
        rows[label] = (level.output_tokens_per_s, level.stats[Metric.E2E_MS].p99 or level.stats[Metric.E2E_MS].p95)
    return rows


def prefix_caching_gain(ort_candidate, workload: Workload, threads: int, artefacts, concurrency: int = 16):
    """TTFT P50 of continuous batching with and without prefix caching, on a load whose prompts share a prefix."""
    paged = Batching("continuous", 32, kv_block_size=16, kv_num_blocks=1024,
                     max_tokens_per_step=512).apply(ort_candidate)
    ttft = {}
    for label, cand in (("without", paged), ("with", PrefixCaching().apply(paged))):
        level = run_benchmark(build_engine(cand, threads, artefacts), workload, _level_cfg(concurrency)).levels[0]
        ttft[label] = level.stats[Metric.TTFT_MS].p50.value
    return ttft


def _level_cfg(concurrency: int):
    return OmegaConf.create({"concurrency": [concurrency], "warmup_requests": 16, "warmup_s": 0.0,
                             "min_requests": 160, "min_duration_s": 4.0, "max_duration_s": 120.0,
                             "request_timeout_s": 60.0})


def main() -> None:
    quiet_libraries()

    console = Console(width=120)
    ceiling = load_generator_ceiling()
    cands, workload, threads, artefacts = default_setup(console)

    engine = build_engine(cands["onnxruntime"], threads, artefacts)
    d, h, overhead = instrumentation_overhead(engine, workload)
    table = Table(title="benchmark harness")
    for col in ("measure", "value", "goal", "met"):
        table.add_column(col)
    table.add_row("load-generator ceiling (no-op engine, 16 clients)", f"{ceiling:,.0f} req/s", ">= 5,000 req/s",
                  "yes" if ceiling >= 5000 else "NO")
    table.add_row("instrumentation overhead (onnxruntime engine, c=1)",
                  f"{overhead * 100:+.2f} % ({d:.2f} -> {h:.2f} ms/request)", "< 2 %",
                  "yes" if overhead < 0.02 else "NO")
    console.print(table)
    batching = batching_comparison(cands["baseline"], cands["onnxruntime"], workload, threads, artefacts)
    table = Table(title="batching, 16 concurrent clients (closed loop); ratio vs the same engine one at a time")
    for col in ("scheduler", "output tokens/s", "vs one at a time", "E2E P99 ms (P95 under 100 samples)"):
        table.add_column(col)
    for label, row in batching.items():
        if isinstance(row, str):
            table.add_row(label, "skipped", "", row)
            continue
        sequential = batching[label.split(":")[0] + ": one at a time"]
        table.add_row(label, f"{row[0]:.0f}", f"{row[0] / sequential[0]:.2f}x", f"{row[1].value:.1f}")
    console.print(table)
    _, shared, _, _ = default_setup(console, ["target.workload.shared_prefix_tokens=64"])
    ttft = prefix_caching_gain(cands["onnxruntime"], shared, threads, artefacts)
    console.print(f"prefix caching, 64 shared prefix tokens, 16 clients, continuous batching (torch): TTFT P50 "
                  f"{ttft['without']:.1f} ms without -> {ttft['with']:.1f} ms with "
                  f"({ttft['with'] / ttft['without']:.2f}x)")


if __name__ == "__main__":
    main()
