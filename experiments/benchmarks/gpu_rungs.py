"""`make bench-gpu`: the GPU rungs on the default model, each against torch eager fp32 on the same GPU.

Prepared for a lent CUDA machine (one short run): TensorRT, CUDA Graph, FP16, INT4 (torchao), FP8, and
onnxruntime-genai's paged continuous batching. A rung whose `check` refuses is printed with its reason;
one that fails prints its error — nothing is skipped silently. Results also go to $OUT/gpu_rungs.json.
"""
from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from experiments.benchmark import run_benchmark
from experiments.benchmarks.common import default_setup
from experiments.console import quiet_libraries
from experiments.fidelity import BaselineLogprobs, fixed_sequences
from experiments.serving import build_engine
from optimizers.base import Env


def gpu_candidates(base):
    from optimizers.batching import Batching
    from optimizers.cuda_graph import CudaGraph
    from optimizers.half_precision import HalfPrecision
    from optimizers.onnxruntime_engine import OnnxRuntimeSwap
    from optimizers.quantization import WeightQuantization
    from optimizers.tensorrt import TensorRT

    cuda = base.edited("on_cuda", execution_provider="cuda")
    ort_cuda = OnnxRuntimeSwap("cuda").apply(base)
    return {"eager fp32 (cuda)": (None, cuda), "fp16": (HalfPrecision(), cuda), "cuda graph": (CudaGraph(), cuda),
            "int4 (torchao)": (WeightQuantization("int4"), cuda), "fp8 (torchao)": (WeightQuantization("fp8"), cuda),
            "tensorrt": (TensorRT(), cuda), "onnxruntime cuda": (None, ort_cuda),
            "continuous (ort paged)": (Batching("continuous", 32, kv_block_size=16, kv_num_blocks=0), ort_cuda)}


def main() -> None:
    quiet_libraries()
    console = Console(width=150)
    env = Env.detect()
    console.print(f"CUDA: {env.cuda}, capability {env.cuda_capability}")
    cands, workload, threads, artefacts = default_setup(console)
    cfg = OmegaConf.create({"concurrency": [1, 16], "warmup_requests": 8, "warmup_s": 0.0, "min_requests": 60,
                            "min_duration_s": 3.0, "max_duration_s": 60.0, "request_timeout_s": 60.0})
    rows, reference = {}, None
    for name, (rung, start) in gpu_candidates(cands["baseline"]).items():
        reason = rung.check(env, start) if rung else (None if env.cuda else "no CUDA device")
        if reason:
            rows[name] = {"skipped": reason}
            continue
        try:
            engine = build_engine(rung.apply(start) if rung else start, threads, artefacts)
            bench = run_benchmark(engine, workload, cfg)
            c1, c16 = bench.levels
            if reference is None:
                windows = fixed_sequences(engine.tokenizer, [" ".join(map(str, range(4000)))], 16, 128, 0)
                reference = BaselineLogprobs.record(engine, windows)
            fid = reference.compare(engine)
            rows[name] = {"ttft_ms": c1.stats["ttft_ms"].p50.value, "tpot_ms": c1.stats["tpot_ms"].p50.value,
                          "tokens_per_s_c16": c16.output_tokens_per_s, "build_s": getattr(engine, "build_seconds", 0),
                          "kl": fid.kl_mean, "top1": fid.top1_agreement, "gpu_mem_mb": c16.gpu_mem_mb_max}
            engine.close()
        except Exception as exc:  # report, go on with the next rung
            rows[name] = {"failed": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
    table = Table(title="GPU rungs vs eager fp32 on the same GPU (c=1 P50; tokens/s at c=16)")
    for col in ("rung", "TTFT ms", "TPOT ms", "tokens/s c=16", "KL vs eager", "top-1", "build s", "note"):
        table.add_column(col, overflow="fold")
    for name, r in rows.items():
        if "ttft_ms" in r:
            table.add_row(name, f"{r['ttft_ms']:.2f}", f"{r['tpot_ms']:.3f}", f"{r['tokens_per_s_c16']:.0f}",
                          f"{r['kl']:.1e}", f"{r['top1']:.3f}", f"{r['build_s']:.1f}", "")
        else:
            table.add_row(name, "", "", "", "", "", "", r.get("skipped") or r.get("failed"))
    console.print(table)
    out = Path(os.environ.get("OUT", ".roi"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_rungs.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
