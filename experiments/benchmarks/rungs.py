"""`make bench` (rungs part): each rung alone against the baseline, measured side by side in one run."""
from __future__ import annotations

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from experiments.benchmark import run_benchmark
from experiments.benchmarks.common import default_setup
from experiments.console import quiet_libraries
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
        params = _parameter_count(cand)
        rows[name] = {"ttft": lv.stats["ttft_ms"].p50.value, "tpot": lv.stats["tpot_ms"].p50.value,
                      "tps": lv.output_tokens_per_s, "bytes": engine.artefact_bytes(),
                      "bits": _weight_bits(engine, cand, params)}
        engine.close()
    base = rows["baseline"]
    table = Table(title="each rung alone vs baseline (c=1, P50; ratio < 1 is faster for TTFT/TPOT)")
    for col in ("rung", "TTFT ms", "TPOT ms", "tokens/s", "TTFT ratio", "TPOT ratio", "tokens/s ratio",
                "artefact MB", "bits/weight"):
        table.add_column(col)
    for name, r in rows.items():
        table.add_row(name, f"{r['ttft']:.2f}", f"{r['tpot']:.3f}", f"{r['tps']:.0f}", f"{r['ttft'] / base['ttft']:.2f}",
                      f"{r['tpot'] / base['tpot']:.2f}", f"{r['tps'] / base['tps']:.2f}", f"{r['bytes'] / 2**20:.2f}",
                      f"{r['bits']:.1f}")
    console.print(table)


def _parameter_count(cand) -> int:
    """Counted on the meta device: the shapes are all that is needed, no weights are allocated."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(cand.target.model_dir))
    return sum(p.numel() for p in model.parameters())


def _weight_bits(engine, cand, params: int) -> float:
    """Stored bits per parameter of what the engine runs (the torch int8 model exists only in memory)."""
    if cand.recipe.engine == "torch" and cand.recipe.quantization == "int8":
        import torch

        state = engine.model.state_dict()
        total = 0
        for t in state.values():
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
        for m in engine.model.modules():
            if isinstance(m, torch.ao.nn.quantized.dynamic.Linear):
                w, _ = m._packed_params._weight_bias()
                total += w.numel() * w.element_size()
        return total * 8 / params
    return engine.artefact_bytes() * 8 / params


if __name__ == "__main__":
    main()
