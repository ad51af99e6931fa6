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

from experiments.benchmark import Prompt, Workload, run_benchmark
from experiments.console import quiet_libraries
from experiments.serving.engine import Engine


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
        harnessed.extend(level.values("e2e_ms")[: len(prompts)])
    d, h = statistics.fmean(direct), statistics.fmean(harnessed)
    return d, h, h / d - 1


def batching_comparison(ort_candidate, workload: Workload, threads: int, artefacts, concurrency: int = 16):
    """Sequential vs static vs dynamic batching (continuous where the platform has it), same load."""
    from optimizers.base import Env
    from optimizers.batching import Batching
    from experiments.serving import build_engine

    cfg = OmegaConf.create({"concurrency": [concurrency], "warmup_requests": 16, "warmup_s": 0.0,
                            "min_requests": 160, "min_duration_s": 4.0, "max_duration_s": 120.0,
                            "request_timeout_s": 60.0})
    env = Env.detect()
    rows = {}
    for label, rung in (("one at a time", None), ("static (B=16, 200 ms)", Batching("static", 16, 200)),
                        ("dynamic (B=16, 5 ms)", Batching("dynamic", 16, 5)),
                        ("continuous (B=32, paged KV)", Batching("continuous", 32, kv_block_size=256))):
        reason = rung.check(env, ort_candidate) if rung else None
        if reason:
            rows[label] = reason
            continue
        cand = rung.apply(ort_candidate) if rung else ort_candidate
        level = run_benchmark(build_engine(cand, threads, artefacts), workload, cfg).levels[0]
        rows[label] = (level.output_tokens_per_s, level.stats["e2e_ms"].p99 or level.stats["e2e_ms"].p95)
    return rows


def main() -> None:
    quiet_libraries()
    from experiments.benchmarks.common import default_setup

    console = Console(width=120)
    ceiling = load_generator_ceiling()
    cands, workload, threads, artefacts = default_setup(console)
    from experiments.serving import build_engine

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
    batching = batching_comparison(cands["onnxruntime"], workload, threads, artefacts)
    base_tps = batching["one at a time"][0]
    table = Table(title="batching on the onnxruntime engine, 16 concurrent clients (closed loop)")
    for col in ("scheduler", "output tokens/s", "vs one at a time", "E2E P99 ms (P95 under 100 samples)"):
        table.add_column(col)
    for label, row in batching.items():
        if isinstance(row, str):
            table.add_row(label, "skipped", "", row)
        else:
            table.add_row(label, f"{row[0]:.0f}", f"{row[0] / base_tps:.2f}x", f"{row[1].value:.1f}")
    console.print(table)


if __name__ == "__main__":
    main()
