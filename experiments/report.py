"""Sweep plots for the parent run: the ladder waterfall, latency vs load, and the latency/accuracy Pareto view."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402  (after choosing the headless backend)

COLORS = {"accepted": "tab:green", "rejected": "tab:red", "skipped": "tab:gray", "failed": "black"}


def objective(outcome, metric: str, stat: str, level: int) -> float | None:
    if outcome.bench is None:
        return None
    values = outcome.bench.level(level).values(metric)
    if len(values) == 0:
        return None
    import numpy as np

    return float(values.mean()) if stat == "mean" else float(np.percentile(values, float(stat[1:])))


def waterfall(outcomes, metric: str, stat: str, level: int) -> Figure:
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.add_subplot()
    names = [o.name for o in outcomes]
    values = [objective(o, metric, stat, level) or 0.0 for o in outcomes]
    ax.bar(names, values, color=[COLORS[o.verdict.status] for o in outcomes])
    for i, o in enumerate(outcomes):
        ax.annotate(o.verdict.status, (i, values[i]), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"{metric} {stat} at c={level} (lower is better)")
    ax.set_title("The ladder: objective per rung (green accepted, red rejected, grey skipped)")
    ax.tick_params(axis="x", labelrotation=20)
    return fig


def latency_vs_load(baseline, champion, metric: str = "e2e_ms") -> Figure:
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
