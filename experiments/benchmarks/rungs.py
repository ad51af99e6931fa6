"""`make bench` (rungs part): each rung alone against the baseline, measured side by side in one run."""
from __future__ import annotations

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from experiments.benchmarks.common import default_setup
from experiments.core.names import Metric
from experiments.measure.load_ladder import run_benchmark
from experiments.record.console import quiet_libraries
from experiments.serving import build_engine


def main() -> None:
    quiet_libraries()
    console = Console(width=140)
    cands, workload, threads, artefacts = default_setup(console)
    cfg = OmegaConf.create({"concurrency": [1], "warmup_requests": 8, "warmup_s": 0.0, "min_requests": 60,
                            "min_duration_s": 3.0, "max_duration_s": 120.0, "request_timeout_s": 60.0})
    rows = {}
    for name, cand in cands.items():
        engine = build_engine(cand, threads, artefacts)
        lv = run_benchmark(engine, workload, cfg).levels[0]
        rows[name] = {"ttft": lv.stats[Metric.TTFT_MS].p50.value, "tpot": lv.stats[Metric.TPOT_MS].p50.value,
                      "tps": lv.output_tokens_per_s, "bytes": engine.artefact_bytes(), "bits": engine.weight_bits(),
                      "build": getattr(engine, "build_seconds", 0.0)}
        engine.close()
    base = rows["baseline"]
    table = Table(title="each rung alone vs baseline (c=1, P50; ratio < 1 is faster for TTFT/TPOT)")
    for col in ("rung", "TTFT ms", "TPOT ms", "tokens/s", "TTFT ratio", "TPOT ratio", "tokens/s ratio",
                "artefact MB", "bits/weight (linear layers)", "build s"):
        table.add_column(col)
    for name, r in rows.items():
        table.add_row(name, f"{r['ttft']:.2f}", f"{r['tpot']:.3f}", f"{r['tps']:.0f}",
                      f"{r['ttft'] / base['ttft']:.2f}",
                      f"{r['tpot'] / base['tpot']:.2f}", f"{r['tps'] / base['tps']:.2f}", f"{r['bytes'] / 2**20:.2f}",
                      f"{r['bits']:.1f}", f"{r['build']:.1f}")
    console.print(table)
    console.print("artefact MB: the files the engine loads (torch casts and quantizes the fp32 safetensors in "
                  "memory); build s: export, quantization or compilation before serving (compile time apart).")


if __name__ == "__main__":
    main()
