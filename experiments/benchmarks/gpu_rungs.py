"""`make bench-gpu`: every GPU rung on the default model, each against torch eager on the same GPU.

One prepared run for a lent CUDA machine (at most `--budget-s`, 10 minutes by default): eager at the model's own
dtype, bf16, fp16, CUDA Graph, TensorRT, torchao int8/int4/fp8, ONNX Runtime on CUDA and its paged continuous
batching. Each rung runs in a child process of its own (two engines in one process disturb each other's
timings) and prints ran, skipped or failed with its reason, TTFT/TPOT, tokens/s and fidelity against eager. On a
machine without CUDA each rung says "no CUDA" and nothing is built. Rows also go to $OUT/gpu_rungs.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from experiments.benchmarks.common import default_setup
from experiments.core.names import Metric
from experiments.core.recipe import Env
from experiments.judge.fidelity import BaselineLogprobs, fixed_sequences
from experiments.measure.load_ladder import run_benchmark
from experiments.record.console import quiet_libraries
from experiments.serving import build_engine
from optimizers.baseline import EagerBaseline
from optimizers.batching import Batching
from optimizers.cuda_graph import CudaGraph
from optimizers.half_precision import HalfPrecision
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.placement import placed
from optimizers.quantization import WeightQuantization
from optimizers.tensorrt import TensorRT

RUNGS = ("eager", "bf16", "fp16", "cuda graph", "tensorrt", "int8 (torchao)", "int4 (torchao)", "fp8 (torchao)",
         "onnxruntime cuda", "continuous (ort paged)")
BENCH = {"concurrency": [1, 8], "warmup_requests": 8, "warmup_s": 0.0, "min_requests": 30, "min_duration_s": 2.0,
         "max_duration_s": 20.0, "request_timeout_s": 60.0}


def gpu_candidates(base) -> dict:
    """rung name -> (optimizer or None, the candidate it starts from); `base` is eager on the GPU."""
    bf16 = HalfPrecision(cuda_dtype="bf16").apply(base)   # torchao's int4 kernel computes in bf16 only
    ort = OnnxRuntimeSwap().apply(base)
    return {"eager": (None, base), "bf16": (HalfPrecision(cuda_dtype="bf16"), base),
            "fp16": (HalfPrecision(cuda_dtype="fp16"), base), "cuda graph": (CudaGraph(), base),
            "tensorrt": (TensorRT(), base), "int8 (torchao)": (WeightQuantization("int8"), bf16),
            "int4 (torchao)": (WeightQuantization("int4"), bf16), "fp8 (torchao)": (WeightQuantization("fp8"), bf16),
            "onnxruntime cuda": (OnnxRuntimeSwap(), base),
            "continuous (ort paged)": (Batching("continuous", 32, kv_block_size=16, kv_num_blocks=0), ort)}


def run_one(name: str, work: Path) -> dict:
    """One rung, in this (child) process: skipped with the rung's reason, or built, loaded and scored."""
    quiet_libraries()
    env = Env.detect()
    cands, workload, threads, artefacts = default_setup(Console(stderr=True))
    base = EagerBaseline().apply(placed(cands["baseline"].target, "cuda", env))
    rung, start = gpu_candidates(base)[name]
    if rung and (reason := rung.check(env, start)):
        return {"status": "skipped", "reason": reason}
    cand = rung.apply(start) if rung else start
    engine = build_engine(cand, threads, artefacts)
    bench = run_benchmark(engine, workload, OmegaConf.create(BENCH))
    reference_file = work / "eager.logprobs.pkl"
    if name == "eager":
        windows = fixed_sequences(engine.tokenizer, [" ".join(map(str, range(4000)))], 16, 128, 0)
        reference_file.write_bytes(pickle.dumps(BaselineLogprobs.record(engine, windows)))
    fid = pickle.loads(reference_file.read_bytes()).compare(engine) if reference_file.exists() else None
    first, last = bench.levels[0], bench.levels[-1]
    engine.close()
    return {"status": "ran", "recipe": f"{cand.recipe.precision}, {cand.recipe.execution_provider}",
            Metric.TTFT_MS: first.stats[Metric.TTFT_MS].p50.value,
            Metric.TPOT_MS: first.stats[Metric.TPOT_MS].p50.value,
            "tokens_per_s": last.output_tokens_per_s, "build_s": getattr(engine, "build_seconds", 0.0),
            "kl": fid.kl_mean if fid else None, "top1": fid.top1_agreement if fid else None,
            "gpu_mem_mb": last.gpu_mem_mb_max,
            "reason": "" if fid else "no eager reference (the eager rung did not run): fidelity not measured"}


def run_all(budget_s: float, work: Path) -> dict:
    """Each rung in a child process, in order, within the budget; a child that fails or overruns is a row."""
    rows, deadline = {}, time.monotonic() + budget_s
    for name in RUNGS:
        left = deadline - time.monotonic()
        if left < 20:
            rows[name] = {"status": "failed", "reason": f"not run: the {budget_s:.0f} s budget was spent"}
            continue
        out = work / f"{name}.json"
        try:
            proc = subprocess.run([sys.executable, "-m", "experiments.benchmarks.gpu_rungs", "--rung", name,
                                   "--work", str(work)], timeout=min(left, 180), capture_output=True, text=True)
        except subprocess.TimeoutExpired as exc:
            rows[name] = {"status": "failed", "reason": f"did not finish in {exc.timeout:.0f} s"}
            continue
        rows[name] = json.loads(out.read_text()) if out.exists() else {
            "status": "failed", "reason": f"child exited {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    return rows


def print_table(console: Console, rows: dict, title: str) -> None:
    table = Table(title=title)
    for col in ("rung", "status", "recipe", "TTFT ms", "TPOT ms", "tokens/s", "KL vs eager", "top-1", "reason"):
        table.add_column(col, overflow="fold")
    fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
    for name, r in rows.items():
        table.add_row(name, r["status"], r.get("recipe", ""), fmt(r.get(Metric.TTFT_MS), ".2f"),
                      fmt(r.get(Metric.TPOT_MS), ".3f"), fmt(r.get("tokens_per_s"), ".0f"), fmt(r.get("kl"), ".1e"),
                      fmt(r.get("top1"), ".3f"), r.get("reason", ""))
    console.print(table)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rung", choices=RUNGS, help="run one rung here (what the parent runs in each child)")
    parser.add_argument("--work", type=Path, help="the parent's folder for rows and the eager reference")
    parser.add_argument("--budget-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.rung:
        try:
            row = run_one(args.rung, args.work)
        except Exception as exc:   # the rung's failure is its row
            row = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:600],
                   "trace": traceback.format_exc()[-2000:]}
        (args.work / f"{args.rung}.json").write_text(json.dumps(row, default=str))
        return
    console = Console(width=160)
    env = Env.detect()
    if not env.cuda:
        rows = {name: {"status": "skipped", "reason": "no CUDA device on this machine"} for name in RUNGS}
        print_table(console, rows, "GPU rungs: no CUDA here, nothing built")
    else:
        console.print(f"CUDA: {env.cuda_device_count} device(s), capability {env.cuda_capability}")
        with tempfile.TemporaryDirectory() as work:
            rows = run_all(args.budget_s, Path(work))
        print_table(console, rows, "GPU rungs vs eager on the same GPU (c=1 P50 TTFT/TPOT; tokens/s at c=8)")
    out = Path(os.environ.get("OUT", ".roi"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_rungs.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
