"""The framework layer up close: a few decode steps of an engine under that engine's own profiler.

torch: `torch.profiler` (CPU, plus CUDA activity on a GPU), ops by self time. onnxruntime-genai: ONNX Runtime's
session profiler (`enable_profiling` in the decoder's session options, through the genai config overlay), node
kernel times by op type. Either way the prefill and a warm-up request run first and stay out of the table,
so the table is the decode step alone; the step time is measured under the profiler (its overhead included).
"""
from __future__ import annotations

import gc
import json
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

PROFILED = ("torch", "onnxruntime")    # the engines with a profiler here (a server's own /metrics are logged)


@dataclass(frozen=True)
class OpTime:
    op: str
    self_ms: float     # self time summed over the profiled steps
    calls: int


@dataclass(frozen=True)
class StepProfile:
    engine: str
    tool: str
    steps: int
    step_ms: float                 # mean wall time of one profiled decode step
    ops: tuple[OpTime, ...]        # every op, most self time first

    @property
    def total_ms(self) -> float:
        return sum(o.self_ms for o in self.ops)

    def to_metrics(self) -> dict[str, float]:
        top = self.ops[0].self_ms / self.total_ms if self.ops and self.total_ms > 0 else 0.0
        return {"profile/decode_step_ms": self.step_ms, "profile/top_op_share": top,
                "profile/op_self_ms_per_step": self.total_ms / max(1, self.steps)}

    def to_markdown(self, top: int = 12) -> str:
        rows = [f"### Framework layer: the decode step's top ops ({self.engine}, {self.tool})", "",
                f"{self.steps} decode steps, {self.step_ms:.3f} ms per step under the profiler; "
                f"self time of all ops {self.total_ms / max(1, self.steps):.3f} ms per step.", "",
                "| # | op | self ms per step | share | calls per step |", "|---|---|---|---|---|"]
        for i, o in enumerate(self.ops[:top], 1):
            rows.append(f"| {i} | `{o.op}` | {o.self_ms / self.steps:.4f} | {o.self_ms / self.total_ms:.1%} "
                        f"| {o.calls / self.steps:.1f} |")
        return "\n".join(rows) + "\n"


def profile_decode(engine, prompt_ids: list[int], steps: int) -> StepProfile:
    """`steps` decode steps of one request after `prompt_ids`, each engine under its own profiler."""
    if steps < 1 or not prompt_ids:
        raise ValueError("profiling needs a prompt and at least one decode step")
    if engine.name == "torch":
        return _torch(engine, prompt_ids, steps)
    if engine.name == "onnxruntime":
        return _onnxruntime(engine, prompt_ids, steps)
    raise ValueError(f"no profiler for engine {engine.name!r}")


def _decode_steps(engine, prompt_ids, steps, profiler) -> float:
    """Warm-up request, then prefill outside and `steps` decode steps inside `profiler`; mean ms per step."""
    for _ in engine.generate(prompt_ids, 2):
        pass
    tokens = engine.generate(prompt_ids, steps + 1)
    next(tokens)                              # the prefill (and first token): not the decode step
    walls = []
    with profiler:
        for _ in range(steps):
            started = time.perf_counter()
            next(tokens)
            walls.append(time.perf_counter() - started)
    tokens.close()
    return 1e3 * sum(walls) / len(walls)


def _torch(engine, prompt_ids, steps) -> StepProfile:
    cuda = getattr(engine, "device", None) is not None and engine.device.type == "cuda"
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    step_ms = _decode_steps(engine, prompt_ids, steps, prof)
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    ops = [OpTime(e.key, getattr(e, attr) / 1e3, int(e.count)) for e in prof.key_averages() if getattr(e, attr) > 0]
    return StepProfile("torch", "torch.profiler, " + ("CUDA self time" if cuda else "CPU self time"), steps,
                       step_ms, tuple(sorted(ops, key=lambda o: -o.self_ms)))


def _onnxruntime(engine, prompt_ids, steps) -> StepProfile:
    import onnxruntime_genai as og  # heavy

    with tempfile.TemporaryDirectory(prefix="roi-ortprof-") as tmp:
        config = engine._config()
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"enable_profiling": f"{tmp}/ort"}}}}))
        original, engine.model = engine.model, og.Model(config)
        try:
            # ONNX Runtime profiles the whole session: the decode steps are picked out of its trace below.
            step_ms = _decode_steps(engine, prompt_ids, steps, nullcontext())
        finally:
            engine.model = original
            gc.collect()                      # the profiled session ends here and writes its trace
        traces = sorted(Path(tmp).glob("ort*.json"))
        if not traces:
            raise RuntimeError("ONNX Runtime wrote no profile (enable_profiling had no effect)")
        events = json.loads(traces[-1].read_text())
    return StepProfile("onnxruntime", "ONNX Runtime session profiler, node kernel time", steps, step_ms,
                       ort_ops(events, steps))


def ort_ops(events: list[dict], steps: int) -> tuple[OpTime, ...]:
    """Kernel time by op type within the last `steps` session runs (the decode steps) of an ORT trace."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[-steps:]
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in runs]
    totals: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") \
                and any(a <= e["ts"] <= b for a, b in windows):
            t = totals.setdefault(e.get("args", {}).get("op_name", e["name"]), [0.0, 0])
            t[0] += e["dur"] / 1e3
            t[1] += 1
    return tuple(sorted((OpTime(op, ms, n) for op, (ms, n) in totals.items()), key=lambda o: -o.self_ms))
