"""One rung: skipped with its reason, or applied, built, measured and gated against the champion in a child
process of its own, everything logged to the rung's MLflow run."""
from __future__ import annotations

import gc
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlflow
import numpy as np
from omegaconf import DictConfig

from experiments import interleaved, isolation, soak, tracking
from experiments.accuracy import AccuracyReport, mlflow_name
from experiments.benchmark import BenchmarkReport, run_benchmark
from experiments.capacity import plan
from experiments.errors import ConfigError
from experiments.gate import Criterion, Gate, Verdict
from experiments.ledger import Ledger
from experiments.outcome import RungOutcome
from experiments.serving import build_engine
from experiments.serving.servers import serve
from experiments.workload import Workload
from optimizers.base import Candidate, Env
from optimizers.baseline import EagerBaseline
from optimizers.placement import placed

log = logging.getLogger(__name__)


@dataclass
class Sweep:
    """What every rung of one sweep shares: config, machine, target, load, data, gate, where to record."""
    cfg: DictConfig
    env: Env
    target: object
    workload: Workload
    kind: object                                # kinds.CausalLM | kinds.Embedding: how answers are scored
    gate: Gate
    experiment_id: str
    ui: object
    scores: dict = field(default_factory=dict)  # numerics key -> (accuracy, fidelity, rung that measured them)
    logs: Path | None = None                    # the rungs' child-process logs


def climb(name, opt, champion, sweep: Sweep, book: Ledger, key: str) -> RungOutcome:
    """Skipped rungs are decided here; a rung that applies is built, measured and gated in its own child
    process (conf/isolation), so a crash, an out-of-memory or a hang fails the rung, not the sweep."""
    tags = {"roi.rung": name, "roi.kind": "rung", "roi.cost": opt.cost,
            "roi.champion_before": champion.run_id if champion else ""}
    with tracking.run(name, sweep.experiment_id, nested=True, tags=tags) as run:
        book.started(name, key, run.info.run_id)
        outcome = RungOutcome(name, Verdict("failed", "not run"), run_id=run.info.run_id, champion_before=champion)
        try:
            device = sweep.cfg.target.get("device", "auto")
            current = champion.candidate if champion else placed(sweep.target, device, sweep.env)
            opt.observe(champion)
            reason = opt.check(sweep.env, current)
            if champion is None and not isinstance(opt, EagerBaseline):
                outcome.verdict = Verdict("skipped", "no champion to compare with: the baseline did not complete")
            elif reason:
                outcome.verdict = Verdict("skipped", f"not applicable here: {reason}")
            else:
                if opt.decision:
                    tracking.set_tag("roi.decision", opt.decision[:5000])
                outcome = _challenge_isolated(name, opt, champion, current, sweep, run.info.run_id, book)
        except ConfigError:
            raise
        except Exception as exc:  # a rung that breaks is a verdict, not the end of the sweep
            log.exception("rung %s failed", name)
            outcome.verdict = Verdict("failed", f"{type(exc).__name__}: {str(exc)[:400]}")
        tracking.set_tags({"roi.verdict": outcome.verdict.status, "roi.reason": outcome.verdict.reason[:5000]})
        if outcome.verdict.status != "accepted":
            tracking.set_tag("roi.reverted_to", champion.run_id if champion else "")
    return outcome


def _challenge_isolated(name, opt, champion, current, sweep: Sweep, run_id: str, book: Ledger) -> RungOutcome:
    iso = sweep.cfg.isolation
    alone = replace(champion, champion_before=None) if champion else None   # not the whole history
    if not iso.enabled:
        outcome, reference, scores = _challenge(name, opt, alone, current, sweep, run_id)
    else:
        limits = isolation.Limits.for_rung(iso, name)
        log_path = sweep.logs / f"{name}-{run_id[:8]}.log"   # a redone rung's log is its own
        done = isolation.run(_challenge_in_child, (name, opt, alone, current, replace(sweep, ui=None), run_id),
                             limits, log_path, on_start=book.child)
        mlflow.log_metrics({"isolation/peak_rss_bytes": done.peak_rss_bytes, "isolation/seconds": done.seconds})
        tracking.set_tag("roi.isolation", f"child process, limits {limits.describe()}, log {log_path}")
        if log_path.exists() and log_path.stat().st_size:
            tracking.log_text(log_path.read_text(errors="replace")[-200_000:], "logs/rung.log")
        if done.failure:
            return RungOutcome(name, Verdict("failed", done.failure), run_id=run_id, champion_before=champion)
        outcome, reference, scores = done.value
    if sweep.kind.reference is None:
        sweep.kind.reference = reference           # the baseline's: fidelity of every later rung is against it
    sweep.scores.update(scores)
    outcome.champion_before = champion
    return outcome


def _challenge_in_child(name, opt, champion, current, sweep: Sweep, run_id: str):
    """The rung's own process: its console, and the rung's MLflow run picked up by id."""
    from experiments.console import SweepConsole, quiet_libraries

    quiet_libraries()
    sweep.ui = SweepConsole()
    mlflow.set_tracking_uri(str(sweep.cfg.tracking.uri))
    with mlflow.start_run(run_id=run_id):
        return _challenge(name, opt, champion, current, sweep, run_id)


def _challenge(name, opt, champion, current, sweep: Sweep, run_id: str):
    """Apply, build, measure and gate one rung, logging to the active (rung) run. Returns (outcome, the
    baseline's reference scores, the score cache)."""
    cfg, gate = sweep.cfg, sweep.gate
    outcome = RungOutcome(name, Verdict("failed", "not run"), run_id=run_id)
    try:
        with sweep.ui.stage(f"{name}: applying the rung ({opt.cost} cost)"):
            outcome.candidate = cand = opt.apply(current)
        if cand.target.model_dir != current.target.model_dir:   # the rung made a new model
            tracking.set_tag("roi.model_dir", str(cand.target.model_dir))
        mlflow.log_params(tracking.flatten({"recipe": cand.describe()}))
        with _measure(cand, sweep, name) as (engine, outcome.bench, outcome.accuracy, outcome.fidelity):
            _log_measurements(outcome)
            outcome.capacity = _capacity_plan(outcome.bench, cfg.capacity)
            if champion is None:
                outcome.verdict = Verdict("accepted", "baseline: the first champion, measured as is")
            else:
                criteria = [_performance(champion, outcome.bench, cand, engine, sweep, name)]
                if cfg.gate.get("slos_still_met", True):
                    criteria.append(gate.slos(champion.bench, outcome.bench))
                criteria += _accuracy_criteria(gate, champion.accuracy, outcome.accuracy)
                drift = sweep.kind.judge(outcome.fidelity)   # fidelity (and generation agreement) vs the baseline
                if opt.fidelity_gated:
                    criteria += drift
                else:
                    tracking.set_tag("roi.fidelity", "recorded, not gated for this rung: "
                                                     + "; ".join(c.detail for c in drift))
                criteria += soak_criterion(engine, outcome.bench, criteria, sweep, name)
                outcome.verdict = Verdict.from_criteria(criteria)
                _log_criteria(outcome.verdict.criteria)
    except ConfigError:
        raise
    except Exception as exc:  # a rung that breaks is a verdict, not the end of the sweep
        log.exception("rung %s failed", name)
        outcome.verdict = Verdict("failed", f"{type(exc).__name__}: {str(exc)[:400]}")
    return outcome, sweep.kind.reference, sweep.scores


@contextmanager
def _measure(cand, sweep: Sweep, name: str):
    """Build the engine, measure it; yields (engine, bench, accuracy, fidelity) and closes the engine after."""
    cfg, ui = sweep.cfg, sweep.ui
    engine = None
    try:
        with ui.stage(f"{name}: building the {cand.recipe.engine} engine"):
            artefacts = Path(cfg.cache_dir) / "artefacts"
            engine = build_engine(cand, int(cfg.threads), artefacts)
        mlflow.log_metric("artefact_bytes", engine.artefact_bytes())
        mlflow.log_metric("weight_bits", engine.weight_bits())
        if hasattr(engine, "build_seconds"):
            mlflow.log_metric("build_seconds", engine.build_seconds)
            tracking.set_tag("roi.artefact_reused", str(engine.reused))
        with ui.stage(f"{name}: load ladder") as st:
            bench = run_benchmark(engine, sweep.workload, cfg.benchmark, cfg.gate.confidence,
                                  on_level=lambda c: st.update(f"{name}: load at concurrency {c}"))
        ui.levels(name, bench)
        key = _numerics_key(cand)
        if key in sweep.scores:
            # Same weights, same runtime, same kernels (only the scheduler differs): lm-eval and the
            # fidelity windows would compute exactly the same numbers again.
            acc, fidelity, measured_by = sweep.scores[key]
            tracking.set_tag("roi.scores_reused_from", measured_by)
            ui.note(f"{name}: accuracy and fidelity as measured on {measured_by} (same model numerics)")
        else:
            acc, fidelity = sweep.kind.score(engine, ui.stage, name)
            sweep.scores[key] = (acc, fidelity, name)
        yield engine, bench, acc, fidelity   # still alive: the soak, if it runs, needs it
    finally:
        if engine is not None:
            engine.close()
        del engine
        gc.collect()


def _performance(champion: RungOutcome, bench: BenchmarkReport, cand: Candidate, engine, sweep: Sweep,
                 name: str) -> Criterion:
    """The champion rebuilt and measured beside the challenger in alternating rounds (gate.interleaved), or,
    with rounds: 0, compared with its recorded run."""
    cfg, gate = sweep.cfg, sweep.gate
    rounds_cfg = cfg.gate.interleaved
    if not rounds_cfg.rounds:
        return gate.performance(champion.bench, bench)
    c = gate.objective_concurrency(champion.bench)
    threads, artefacts = int(cfg.threads), Path(cfg.cache_dir) / "artefacts"
    builders = {"champion": lambda: build_engine(champion.candidate, threads, artefacts),
                "challenger": lambda: build_engine(cand, threads, artefacts)}
    with sweep.ui.stage(f"{name}: champion and challenger in {rounds_cfg.rounds} alternating rounds at c={c}") as st:
        rival = builders["champion"]()
        slow = {n: e for n, e in (("champion", rival), ("challenger", engine))
                if e.rebuild_seconds() > float(rounds_cfg.rebuild_max_s)}
        if "champion" not in slow:
            rival.close()
        try:
            rounds = interleaved.measure(builders, sweep.workload, cfg.benchmark, rounds_cfg, c, cfg.gate.confidence,
                                         prebuilt=slow, on_round=lambda r: st.update(
                                             f"{name}: interleaved round {r + 1} of {rounds_cfg.rounds} at c={c}"))
        finally:
            if "champion" in slow:
                rival.close()
    tracking.set_tag("roi.gate.interleaved", "fresh build per run: " + ", ".join(
        f"{n} {'no (built once: its build took longer than rebuild_max_s)' if n in slow else 'yes'}"
        for n in builders))
    obj = cfg.gate.objective
    tracking.log_text(rounds.to_csv(obj.metric, obj.stat), "gate/interleaved_rounds.csv")
    for r, ratio in enumerate(rounds.ratios("challenger", "champion", obj.metric, obj.stat)):
        if np.isfinite(ratio):
            mlflow.log_metric("gate/round_ratio", float(ratio), step=r)
    return gate.interleaved(rounds)


def _accuracy_criteria(gate: Gate, champion: list[AccuracyReport], challenger: list[AccuracyReport]) -> list[Criterion]:
    """One criterion per gated score; with several, each named after what tells it apart (the metric within
    one task, as recall@1 and @5; else the task) so none overwrites another's tag and numbers."""
    criteria = [gate.accuracy(c, n) for c, n in zip(champion, challenger)]
    if len(criteria) < 2:
        return criteria
    one_task = len({n.task for n in challenger}) < len(challenger)
    return [replace(c, name=mlflow_name(f"accuracy_{n.metric if one_task else n.task}").replace(".", "_"))
            for c, n in zip(criteria, challenger)]


def soak_criterion(engine, bench: BenchmarkReport, criteria: list[Criterion], sweep: Sweep, name: str) -> list[Criterion]:
    """Cheapest first: only a challenger that passed every other criterion is held under load this long."""
    cfg = sweep.cfg
    failed = [c.name for c in criteria if not c.passed]
    if failed or not cfg.soak.enabled:
        why = f"{', '.join(failed)} failed first" if failed else "soak.enabled=false"
        tracking.set_tag("roi.soak", f"skipped: {why}")
        return []
    obj = cfg.gate.objective
    fallback = int(max(cfg.benchmark.concurrency)) if obj.concurrency == "max" else int(obj.concurrency)
    clients, why = soak.concurrency_for(cfg.soak.concurrency, bench.capacity, fallback)
    total = cfg.soak.warmup_s + cfg.soak.duration_s
    with sweep.ui.stage(f"{name}: soak at c={clients} ({why}) for {total:g} s") as st:
        server = serve(engine)
        try:
            report = soak.run_soak(server, sweep.workload, cfg.soak, clients, on_window=lambda w: st.update(
                f"{name}: soak at c={clients}, {w.start_s + w.duration_s:.0f} of {total:g} s"))
        finally:
            server.close()
    report.to_mlflow()
    crit = report.criterion()
    tracking.set_tag("roi.soak", f"ran at c={clients} ({why}): {'clean' if crit.passed else 'NOT clean'}")
    return [crit]


def _numerics_key(cand: Candidate) -> tuple:
    """What decides the numbers lm-eval and fidelity see; batching settings do not (ONNX Runtime's paged
    export on CUDA is another graph, so it counts)."""
    r = cand.recipe
    paged_graph = r.engine == "onnxruntime" and r.batching == "continuous"
    return (str(cand.target.model_dir), r.engine, r.precision, r.quantization, r.execution_provider, r.compile,
            r.cuda_graph, paged_graph)


def _log_measurements(outcome: RungOutcome) -> None:
    from experiments import report

    tracking.log_series(outcome.bench.metric_series())
    mlflow.log_figure(report.latency_percentiles(outcome.bench), "benchmark/latency_percentiles.png")
    mlflow.log_figure(report.throughput_vs_latency(outcome.bench), "benchmark/throughput_vs_latency.png")
    tracking.log_text(outcome.bench.samples_csv(), "benchmark/samples.csv")
    tracking.set_tags({f"validity.{k}": str(v) for k, v in outcome.bench.validity().items()})
    if outcome.fidelity is not None:
        mlflow.log_metrics(outcome.fidelity.to_metrics())
    shared = len({a.task for a in outcome.accuracy}) < len(outcome.accuracy)   # recall@1 and @5 of one task
    for acc in outcome.accuracy:
        mlflow.log_metrics(acc.to_metrics())
        folder = f"accuracy/{acc.task}/{mlflow_name(acc.metric)}" if shared else f"accuracy/{acc.task}"
        tracking.write_json(acc.results, f"{folder}/results.json")


def _capacity_plan(bench, cfg_capacity):
    """The plan this rung's measurements imply; logged on its run so the UI compares what each rung saves."""
    try:
        result = plan(bench, cfg_capacity)
    except ValueError as exc:  # no level met the tier: say so instead of inventing a number
        tracking.set_tag("roi.capacity", f"no plan: {exc}")
        return None
    mlflow.log_metrics(result.to_metrics())
    tracking.log_text(result.to_markdown(), "capacity/plan.md")
    tracking.set_tag("roi.capacity", f"{result.replicas} replicas for {cfg_capacity.peak_qps} QPS "
                                   f"({result.tier}), {result.cost_per_hour:.2f}/h")
    return result


def _log_criteria(criteria: tuple[Criterion, ...]) -> None:
    for c in criteria:
        mlflow.log_metrics({f"gate/{c.name}/{k}": v for k, v in c.numbers.items()})
        tracking.set_tag(f"roi.gate.{c.name}", f"{'pass' if c.passed else 'FAIL'}: {c.detail}"[:5000])
