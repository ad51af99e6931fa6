"""Like with like: an in-process candidate measured as the sweep measures it (its engine, our queue server and the
load's clients in one process) and as it would be served (`roi-ladder serve`: our HTTP server in a process of its
own, this process the client), on the same requests, one after the other, `--rounds` times in alternating order.

The serving ladders judge in-process candidates against servers (llama-server's defaults, vLLM): if what the
sweep measures of an in-process engine differs from what `roi-ladder serve` delivers by more than the gate's
margin, the comparison flatters one side. Each level's ratio (served / in process) of output tokens/s and of
TPOT p50 is given with a 95 % t-interval over the rounds' log ratios.

    python -m experiments.benchmarks.served_vs_in_process --rungs onnxruntime,int8 target=smollm2 [--rounds 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy import stats

from experiments.benchmarks.common import compose_default
from experiments.climb.endpoint import candidate
from experiments.core.names import Metric
from experiments.measure import isolation
from experiments.measure.load import run_level
from experiments.serving import build_engine
from experiments.serving.http_client import EndpointServer
from experiments.serving.server_process import ServerProcess
from experiments.serving.servers import serve
from experiments.targets.resolve import texts_unbuilt
from experiments.targets.workload import LADDER, Workload
from optimizers.base import SERVING_ENGINES

SIDES = ("in process", "served")


def _levels_in_process(cand, threads: int, artefacts: Path, workload, load, confidence: float, blocks) -> list:
    """Each level on one engine built here, behind the in-process queue server the sweep measures through."""
    engine = build_engine(cand, threads, artefacts)
    try:
        server = serve(engine)
        try:
            return [run_level(server, workload, c, load, confidence, b) for c, b in blocks]
        finally:
            server.close()
    finally:
        engine.close()


def _levels_served(rungs: str, overrides: list[str], tokenizer, workload, load, confidence: float, blocks,
                   log: Path) -> list:
    """Each level against `roi-ladder serve --rungs ...` started for this run and stopped after it."""
    command = [sys.executable, "-m", "experiments.cli", "serve", "--rungs", rungs, "--port", "{port}", *overrides]
    with ServerProcess(command, log).start(timeout_s=600) as process:
        client = EndpointServer(process.url, None, "ids", tokenizer, timeout_s=float(load.request_timeout_s))
        try:
            return [run_level(client, workload, c, load, confidence, b) for c, b in blocks]
        finally:
            client.close()


def figures(level) -> tuple[float, float]:
    """(output tokens/s, TPOT p50 ms) of one level."""
    return level.output_tokens_per_s, level.stats[Metric.TPOT_MS].p50.value


def ratio(served: list[float], in_process: list[float]) -> tuple[float, float, float]:
    """The geometric mean of served / in process over the rounds, with its 95 % t-interval."""
    logs = np.log(np.asarray(served) / np.asarray(in_process))
    if logs.size < 2:
        return float(np.exp(logs.mean())), float("nan"), float("nan")
    half = stats.t.ppf(0.975, logs.size - 1) * logs.std(ddof=1) / np.sqrt(logs.size)
    return float(np.exp(logs.mean())), float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def main(argv=None) -> None:
    from transformers import AutoTokenizer  # heavy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rungs", required=True, help="the in-process candidate, as `roi-ladder serve --rungs`")
    parser.add_argument("--rounds", type=int, default=3)
    args, overrides = parser.parse_known_args(argv)
    console = Console()
    cfg = compose_default(overrides)
    cand = candidate(cfg, args.rungs.split(","), console.print)
    if cand.recipe.engine in SERVING_ENGINES:
        raise SystemExit(f"{args.rungs} runs a serving engine's own server: nothing in process to compare")
    tokenizer = AutoTokenizer.from_pretrained(cand.target.model_dir)
    wl, load = cfg.target.workload, cfg.benchmark
    workload = Workload.from_texts(texts_unbuilt(cfg.target), tokenizer, wl.input_tokens, wl.output_tokens, wl.prompts,
                                   max(8, int(load.warmup_requests)), cfg.seed, wl.get("shared_prefix_tokens", 0))
    levels = [int(c) for c in load.concurrency]
    limits = isolation.Limits(float(cfg.isolation.time_limit_s), 16 * 2**30, float(cfg.isolation.poll_s))
    logs = Path(tempfile.mkdtemp(prefix="roi-served-vs-in-process-"))
    found = {side: [] for side in SIDES}          # per round: [(tokens/s, TPOT) per level]
    for n in range(args.rounds):
        # each round its own requests (none sent to a server twice), the same for both sides
        blocks = [(c, LADDER + 100 + n * len(levels) + i) for i, c in enumerate(levels)]
        for side in (SIDES if n % 2 == 0 else SIDES[::-1]):
            console.print(f"round {n + 1} of {args.rounds}: {side}")
            if side == "served":
                got = _levels_served(args.rungs, overrides, tokenizer, workload, load, cfg.gate.confidence, blocks,
                                     logs / f"served-{n}.log")
            else:
                done = isolation.run(_levels_in_process, (cand, int(cfg.threads), Path(cfg.cache_dir) / "artefacts",
                                                          workload, load, cfg.gate.confidence, blocks),
                                     limits, logs / f"in-process-{n}.log")
                if done.failure:
                    raise SystemExit(f"in process: {done.failure}")
                got = done.value
            found[side].append([figures(level) for level in got])
    _report(console, args.rungs, levels, found, float(cfg.gate.min_gain))


def against_margin(lo: float, hi: float, margin: float) -> str:
    """Whether a ratio's interval shows the two apart by more than the gate's margin, within it, or neither."""
    low, high = 1 - margin, 1 / (1 - margin)
    if hi < low or lo > high:
        return "beyond the margin"
    return "within the margin" if low <= lo and hi <= high else "undecided"


def _report(console, rungs: str, levels: list[int], found: dict, margin: float) -> None:
    table = Table(title=f"{rungs}: behind roi-ladder serve / in process ({len(found['served'])} rounds)")
    for col in ("c", "tokens/s in process", "tokens/s served", "ratio [95 % CI]", "TPOT p50 in process",
                "TPOT p50 served", "ratio [95 % CI]"):
        table.add_column(col, justify="right")
    verdicts = []
    for i, c in enumerate(levels):
        row = [str(c)]
        for k, what in enumerate(("tokens/s", "TPOT")):
            ours = [r[i][k] for r in found["in process"]]
            theirs = [r[i][k] for r in found["served"]]
            mid, lo, hi = ratio(theirs, ours)
            row += [f"{np.mean(ours):.1f}", f"{np.mean(theirs):.1f}", f"×{mid:.3f} [{lo:.3f}, {hi:.3f}]"]
            verdicts.append(f"{what} at c={c}: {against_margin(lo, hi, margin)}")
        table.add_row(*row)
    console.print(table)
    console.print(f"against the gate's margin ({margin:.0%}: ×{1 - margin:.2f} to ×{1 / (1 - margin):.2f}): "
                  + "; ".join(verdicts))
    console.print("beyond it, the sweep's in-process figure is not what serving delivers")


if __name__ == "__main__":
    main()
