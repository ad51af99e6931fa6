"""Sweep plots for the parent run: the ladder waterfall, latency vs load, and the latency/accuracy Pareto view."""
from __future__ import annotations

import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402  (after choosing the headless backend)

from experiments.core.names import Metric
from experiments.targets.kinds import kind_of

COLORS = {"accepted": "tab:green", "rejected": "tab:red", "undecided": "tab:orange", "skipped": "tab:gray",
          "failed": "black"}


def objective(outcome, metric: str, stat: str, level: int) -> float | None:
    if outcome.bench is None:
        return None
    values = outcome.bench.level(level).values(metric)
    if len(values) == 0:
        return None
    return float(values.mean()) if stat == "mean" else float(np.percentile(values, float(stat[1:])))


def waterfall(outcomes, metric: str, stat: str, level: int) -> Figure:
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.add_subplot()
    names = [o.name for o in outcomes]
    values = [objective(o, metric, stat, level) or 0.0 for o in outcomes]
    ax.bar(names, values, color=[COLORS[o.verdict.status] for o in outcomes])
    for i, o in enumerate(outcomes):
        ax.annotate(o.verdict.status, (i, values[i]), ha="center", va="bottom", fontsize=8)
    champion = champion_line(outcomes, metric, stat, level)
    if champion:
        xs, ys = zip(*champion)
        ax.plot(xs, ys, "k_", markersize=28, markeredgewidth=2, label="the champion it was gated against")
        ax.legend(fontsize=8)
    ax.set_ylabel(f"{metric} {stat} at c={level} (lower is better)")
    ax.set_title("The ladder: objective per rung (green accepted, red rejected, orange undecided, grey skipped)")
    ax.tick_params(axis="x", labelrotation=20)
    return fig


def champion_line(outcomes, metric: str, stat: str, level: int) -> list[tuple[int, float]]:
    """(bar index, objective of the champion that rung was gated against) for each rung that had one."""
    out = []
    for i, o in enumerate(outcomes):
        value = objective(o.champion_before, metric, stat, level) if o.champion_before else None
        if value is not None:
            out.append((i, value))
    return out


def latency_vs_load(baseline, champion, metric: str = Metric.E2E_MS) -> Figure:
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    for outcome, style in ((baseline, "--"), (champion, "-")):
        if outcome is None or outcome.bench is None:
            continue
        levels = outcome.bench.levels
        for q in ("p50", "p95"):
            ys = [lv.stats[metric].stat(q) if lv.stats.get(metric) else None for lv in levels]
            ax.plot([lv.concurrency for lv in levels], ys, style, marker="o", label=f"{outcome.name} {q}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrency")
    ax.set_ylabel(f"{metric}")
    ax.set_title("Latency percentiles vs load: baseline (dashed) and champion")
    ax.legend(fontsize=8)
    return fig


def pareto(outcomes, metric: str, stat: str, level: int) -> Figure:
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    for o in outcomes:
        x = objective(o, metric, stat, level)
        if x is None or not o.accuracy:
            continue
        ax.scatter(x, o.accuracy[0].value, color=COLORS[o.verdict.status])
        ax.errorbar(x, o.accuracy[0].value, yerr=o.accuracy[0].stderr, color=COLORS[o.verdict.status], alpha=0.4)
        ax.annotate(o.name, (x, o.accuracy[0].value), fontsize=8, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel(f"{metric} {stat} at c={level} (lower is better)")
    ax.set_ylabel("accuracy (± stderr)")
    ax.set_title("Latency vs accuracy over all measured rungs")
    return fig


def latency_percentiles(bench, metrics=(Metric.E2E_MS, Metric.TTFT_MS, Metric.TPOT_MS, Metric.BATCH_MS)) -> Figure:
    """One rung: P50 / P95 / P99 of each latency against concurrency, with the percentiles' CIs as bands (the
    latencies that apply: an encoder has no TTFT or TPOT, a decoder no batch latency)."""
    metrics = [m for m in metrics if any(lv.stats.get(m) is not None for lv in bench.levels)] or [Metric.E2E_MS]
    fig = Figure(figsize=(4 * len(metrics), 3.5), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    xs = [lv.concurrency for lv in bench.levels]
    for ax, metric in zip(axes, metrics):
        for q in ("p50", "p95", "p99"):
            points = [(x, getattr(lv.stats[metric], q)) for x, lv in zip(xs, bench.levels)
                      if lv.stats.get(metric) is not None and getattr(lv.stats[metric], q) is not None]
            if not points:
                continue
            x, quant = zip(*points)
            ax.plot(x, [p.value for p in quant], marker="o", label=q)
            lo = [p.ci_low if p.ci_low is not None else p.value for p in quant]
            hi = [p.ci_high if p.ci_high is not None else p.value for p in quant]
            ax.fill_between(x, lo, hi, alpha=0.2)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(metric)
        ax.legend(fontsize=8)
    fig.suptitle("Latency percentiles vs concurrency (bands: confidence intervals)")
    return fig


def throughput_vs_latency(bench) -> Figure:
    """One rung: its kind's throughput (tokens/s, embeddings/s) against P95 E2E, one point per level: where the
    knee of the curve is."""
    fig = Figure(figsize=(5, 4), layout="constrained")
    ax = fig.add_subplot()
    kind = kind_of(bench.kind)
    points = [(lv.stats[Metric.E2E_MS].p95.value, kind.throughput(lv), lv.concurrency)
              for lv in bench.levels if lv.stats.get(Metric.E2E_MS) is not None]
    if points:
        x, y, c = zip(*points)
        ax.plot(x, y, marker="o")
        for xi, yi, ci in points:
            ax.annotate(f"c={ci}", (xi, yi), fontsize=8, xytext=(4, -10), textcoords="offset points")
    ax.set_xlabel("E2E P95 ms")
    ax.set_ylabel(kind.throughput_unit)
    ax.set_title("Throughput vs latency")
    return fig
