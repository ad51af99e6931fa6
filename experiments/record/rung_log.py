"""What a rung's run records: its measurements (series, plots, samples, validity), fidelity and accuracy,
the gate's rounds and criteria, and its capacity plan."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from experiments.core.names import Tag
from experiments.core.reports import BenchmarkReport
from experiments.judge.accuracy import AccuracyReport, mlflow_name
from experiments.judge.gate import Criterion
from experiments.measure import interleaved
from experiments.record import benchmark_log, plots, tracking
from experiments.record.outcome import RungOutcome


def log_measurements(outcome: RungOutcome) -> None:
    tracking.log_series(benchmark_log.metric_series(outcome.bench))
    tracking.log_figure(plots.latency_percentiles(outcome.bench), "benchmark/latency_percentiles.png")
    tracking.log_figure(plots.throughput_vs_latency(outcome.bench), "benchmark/throughput_vs_latency.png")
    tracking.log_text(benchmark_log.samples_csv(outcome.bench), "benchmark/samples.csv")
    tracking.set_tags({f"validity.{k}": str(v) for k, v in outcome.bench.validity().items()})
    if outcome.fidelity is not None:
        tracking.log_metrics(outcome.fidelity.to_metrics())
    log_accuracy(outcome.accuracy)


def log_recorded_again(bench: BenchmarkReport, concurrency: int, run_id: str | None = None) -> None:
    """A level of a recorded run that a gate measured again (the first disturbed), on the active run or on
    `run_id` (a champion's, measured again by a later rung's gate): logged again at its step, so that it is the
    run's latest figure there (the history keeps both)."""
    again = replace(bench, levels=(bench.level(concurrency),))
    tracking.log_series(benchmark_log.metric_series(again), run_id=run_id)
    if run_id is None:
        tracking.log_text(benchmark_log.samples_csv(again), f"benchmark/samples_recorded_again_c{concurrency}.csv")


def log_accuracy(reports: list[AccuracyReport]) -> None:
    shared = len({a.task for a in reports}) < len(reports)   # recall@1 and @5 of one task
    for acc in reports:
        tracking.log_metrics(acc.to_metrics())
        folder = f"accuracy/{acc.task}/{mlflow_name(acc.metric)}" if shared else f"accuracy/{acc.task}"
        tracking.write_json(acc.results, f"{folder}/results.json")


def log_rounds(rounds: interleaved.Rounds, obj, csv_path: str, metric: str) -> None:
    tracking.log_text(rounds.to_csv(obj.metric, obj.stat), csv_path)
    for r, ratio in enumerate(rounds.ratios("challenger", "champion", obj.metric, obj.stat)):
        if np.isfinite(ratio):
            tracking.log_metric(metric, float(ratio), step=r)


def log_criteria(criteria: tuple[Criterion, ...]) -> None:
    for c in criteria:
        tracking.log_metrics({f"gate/{c.name}/{k}": v for k, v in c.numbers.items()})
        tracking.set_tag(f"{Tag.GATE}{c.name}", f"{c.word}: {c.detail}"[:5000])


def log_capacity(result, cfg_capacity, no_plan: str | None = None) -> None:
    """The plan a rung's measurements imply, on its run, so the UI compares what each rung saves."""
    if result is None:
        tracking.set_tag(Tag.CAPACITY, f"no plan: {no_plan}")
        return
    tracking.log_metrics(result.to_metrics())
    tracking.log_text(result.to_markdown(), "capacity/plan.md")
    tracking.set_tag(Tag.CAPACITY, f"{result.replicas} replicas for {cfg_capacity.peak_qps} QPS "
                                   f"({result.tier}), {result.cost_per_hour:.2f}/h")


def log_server(server: dict) -> None:
    """A serving engine's server: its start-up time (a cost every deployment pays), what ran it, and its log."""
    tracking.log_metric("startup_s", float(server["startup_s"]))
    tracking.set_tags({f"{Tag.SERVER}{key}": str(value) for key, value in server.items() if key != "startup_s"})
    if Path(server.get("log", "")).is_file():
        tracking.log_file(server["log"], "server")


def note(tag: str, text: str) -> None:
    """How the rung was decided, in words, where a reviewer reads it (the run's tags)."""
    tracking.set_tag(tag, text[:5000])


def log_verdict(outcome: RungOutcome, champion: RungOutcome | None) -> None:
    tracking.set_tags({Tag.VERDICT: outcome.verdict.status, Tag.REASON: outcome.verdict.reason[:5000]})
    if outcome.verdict.status != "accepted":
        tracking.set_tag(Tag.REVERTED_TO, champion.run_id if champion else "")


def log_isolation(done, limits, log_path: Path) -> None:
    """The rung's child process: its peak memory, time, limits and log."""
    tracking.log_metrics({"isolation/peak_rss_bytes": done.peak_rss_bytes, "isolation/seconds": done.seconds})
    tracking.set_tag(Tag.ISOLATION, f"child process, limits {limits.describe()}, log {log_path}")
    if log_path.exists() and log_path.stat().st_size:
        tracking.log_text(log_path.read_text(errors="replace")[-200_000:], "logs/rung.log")


def log_applied(cand, applied: dict, new_model: bool, measurement: str) -> None:
    """What the rung made: the recipe, the optimizer's own parameters, a new model's folder."""
    if new_model:
        tracking.set_tag(Tag.MODEL_DIR, str(cand.target.model_dir))
    tracking.log_params(tracking.flatten({"recipe": cand.describe()}))
    tracking.log_params(applied)
    tracking.set_tag(Tag.MEASUREMENT, measurement)


def log_build(measured) -> None:
    """What building the engine cost and made (contender.Measured)."""
    tracking.log_metric("artefact_bytes", measured.artefact_bytes)
    tracking.log_metric("weight_bits", measured.weight_bits)
    if measured.build_seconds is not None:
        tracking.log_metric("build_seconds", measured.build_seconds)
        tracking.set_tag(Tag.ARTEFACT_REUSED, str(measured.artefact_reused))
    if measured.server:
        log_server(measured.server)
    if measured.scores_reused_from:
        tracking.set_tag(Tag.SCORES_REUSED_FROM, measured.scores_reused_from)
