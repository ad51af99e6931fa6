"""The ladder: champion vs challenger, rung by rung in ROI order; a rejected rung is reverted."""
from __future__ import annotations

import gc
import json
import logging
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlflow
import numpy as np
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from experiments import interleaved, isolation, kinds, ledger, soak, tracking
from experiments.accuracy import AccuracyReport, check_tasks, mlflow_name
from experiments.benchmark import LATENCY_METRICS, BenchmarkReport, Workload, check_load, run_benchmark, serve
from experiments.capacity import check_config as check_capacity_config, plan
from experiments.errors import ConfigError, SweepInterrupted
from experiments.fidelity import FidelityReport
from experiments.gate import Criterion, Gate, Verdict, check_config as check_gate_config
from experiments.interrupts import GracefulStop
from experiments.ledger import Ledger
from experiments.serving import build_engine
from experiments.secrets import scrub_text
from experiments.slo import applicable, parse_all
from experiments.targets import check_source, resolve
from optimizers.base import Candidate, Env, Optimizer
from optimizers.baseline import EagerBaseline

log = logging.getLogger(__name__)
STATS = ("mean", "p50", "p95", "p99")


@dataclass
class RungOutcome:
    name: str
    verdict: Verdict
    candidate: Candidate | None = None
    bench: BenchmarkReport | None = None
    accuracy: list[AccuracyReport] = field(default_factory=list)
    capacity: object | None = None     # capacity.CapacityPlan
    fidelity: FidelityReport | None = None
    run_id: str | None = None
    champion_before: "RungOutcome | None" = None

    @staticmethod
    def columns(decodes: bool, top: int) -> list[tuple[str, str, str]]:
        """(summary key, header, format) of the ladder table: TTFT and TPOT for a decoder, E2E and
        embeddings/s for an encoder."""
        if decodes:
            return [("ttft_ms_p50", "TTFT p50 ms (c=1)", "%.2f"), ("tpot_ms_p50", "TPOT p50 ms (c=1)", "%.3f"),
                    ("tokens_per_s", f"tokens/s (c={top})", "%.0f"), ("accuracy", "accuracy", "%.3f")]
        return [("e2e_ms_p50", "E2E p50 ms (c=1)", "%.2f"), ("tokens_per_s", f"embeddings/s (c={top})", "%.0f"),
                ("accuracy", "accuracy", "%.3f")]

    def summary(self, top_concurrency: int) -> dict[str, float]:
        if self.bench is None:
            return {}
        c1, top = self.bench.levels[0], self.bench.level(top_concurrency)
        p50 = lambda m: c1.stats[m].p50.value if c1.stats.get(m) else float("nan")  # noqa: E731
        out = {"e2e_ms_p50": p50("e2e_ms"), "tokens_per_s": top.output_tokens_per_s}
        if c1.decodes:
            out.update(ttft_ms_p50=p50("ttft_ms"), tpot_ms_p50=p50("tpot_ms"))
        if self.accuracy:
            out["accuracy"] = self.accuracy[0].value
        return out


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


@dataclass
class SweepResult:
    parent_run_id: str
    experiment_id: str
    outcomes: list[RungOutcome]
    champion: RungOutcome | None


# --- validation before any long work ---------------------------------------------------------------------
def load_rungs(cfg: DictConfig) -> list[tuple[str, Optimizer]]:
    rungs, seen = [], {}
    for name, rung_cfg in (cfg.ladder.get("rungs") or {}).items():
        if not isinstance(rung_cfg, DictConfig) or "_target_" not in rung_cfg:
            raise ConfigError(f"rung {name!r} has no _target_",
                              "point _target_ at an Optimizer class in optimizers/, as conf/rung/*.yaml do")
        settings = json.dumps(OmegaConf.to_container(rung_cfg, resolve=True), sort_keys=True)
        if settings in seen:   # the same recipe climbed twice: a second verdict on one change, twice the time
            raise ConfigError(f"the ladder lists one rung twice: {name!r} has the same config as {seen[settings]!r}",
                              f"drop {name!r} from the ladder (or give it different settings)")
        seen[settings] = name
        try:
            opt = instantiate(rung_cfg)
        except InstantiationException as exc:
            cause = exc.__cause__ or exc
            raise ConfigError(f"rung {name!r} could not be built from its config: {cause}",
                              f"check conf/rung/{name}.yaml: keys must match the optimizer's arguments") from None
        if not isinstance(opt, Optimizer):
            raise ConfigError(f"rung {name!r} has _target_ {rung_cfg.get('_target_')}, which is not an Optimizer",
                              "point _target_ at a class in optimizers/")
        opt.name = name
        rungs.append((name, opt))
    if not rungs or not isinstance(rungs[0][1], EagerBaseline):
        raise ConfigError("the ladder must start with the baseline rung (the first champion)",
                          "put `/rung@rungs.baseline: baseline` first in the ladder's defaults")
    return rungs


def check_required(cfg: DictConfig, rungs: list[tuple[str, Optimizer]], env: Env) -> None:
    """`ladder.required`: rungs this sweep is for. One this machine cannot run (no CUDA device, a missing
    package) is refused now rather than recorded as skipped after the baseline has been measured."""
    by_name = dict(rungs)
    for name in cfg.ladder.get("required") or []:
        if name not in by_name:
            raise ConfigError(f"ladder.required names {name!r}, which is not in the ladder ({', '.join(by_name)})",
                              f"add conf/rung/{name}.yaml to the ladder or drop {name!r} from ladder.required")
        if reason := by_name[name].machine_check(env):
            raise ConfigError(f"rung {name!r} is required (ladder.required) but cannot run on this machine: "
                              f"{reason}", f"run the sweep where it can, or drop {name!r} from ladder.required "
                                       "to let the sweep skip it")


def check_writable(data_dir: Path) -> None:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=data_dir, prefix=".write-probe-"):   # unique: sweeps run in parallel
            pass
    except OSError as exc:
        raise ConfigError(f"data directory {data_dir} is not writable ({exc.strerror})",
                          "set data_dir=... or ROI_LADDER_HOME to a writable folder") from None


def validate(cfg: DictConfig, env: Env | None = None) -> list[tuple[str, Optimizer]]:
    check_source(cfg.target)
    if not str(cfg.threads).isdigit() or int(cfg.threads) < 1:
        raise ConfigError(f"threads={cfg.threads} is not an integer >= 1",
                          "set threads to the cores the engine under test may use, e.g. threads=2")
    bench = cfg.benchmark
    check_load(bench)
    levels = [int(round(float(r))) for r in bench.rates] if bench.mode == "open" else list(bench.concurrency)
    check_capacity_config(cfg.capacity)
    soak.check_config(cfg.soak)
    isolation.check_config(cfg.isolation)
    check_gate_config(cfg.gate)
    obj = cfg.gate.objective
    if obj.metric not in LATENCY_METRICS:
        raise ConfigError(f"gate.objective.metric {obj.metric!r} is unknown", f"use one of {LATENCY_METRICS}")
    if obj.stat not in STATS:
        raise ConfigError(f"gate.objective.stat {obj.stat!r} is unknown", f"use one of {STATS}")
    if obj.concurrency != "max" and (not str(obj.concurrency).isdigit() or int(obj.concurrency) not in levels):
        raise ConfigError(f"gate.objective.concurrency={obj.concurrency} is not a measured level {levels}",
                          "add it to benchmark.concurrency or pick one of the levels")
    check_writable(Path(cfg.data_dir))
    if cfg.target.kind == "causal-lm" and cfg.accuracy.include_path:   # shipped tasks are known once built
        check_tasks(list(cfg.accuracy.tasks), Path(cfg.accuracy.include_path))
    rungs = load_rungs(cfg)
    check_required(cfg, rungs, env or Env.detect())
    return rungs


# --- the sweep --------------------------------------------------------------------------------------------
def run_sweep(cfg: DictConfig, ui) -> SweepResult:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rungs = validate(cfg)
    data_dir = Path(cfg.data_dir)
    experiment_id = tracking.connect(cfg.tracking)   # fails fast on a bad tracking URI; safe for parallel jobs
    env = Env.detect()
    with ui.stage("target: building or loading the model"):
        target, texts, shipped_tasks = resolve(cfg.target, Path(cfg.cache_dir), data_dir, ui.note)
    include_path = Path(cfg.accuracy.include_path) if cfg.accuracy.include_path else shipped_tasks
    kind = kinds.for_target(cfg, target, texts, include_path)
    workload = kind.workload()
    if cfg.gate.objective.metric not in workload.metrics:
        raise ConfigError(f"gate.objective.metric {cfg.gate.objective.metric!r} is not measured for a {target.kind} "
                          f"target", f"use one of {workload.metrics}")
    _, not_applicable = applicable(parse_all(cfg.benchmark.slos), workload.metrics)
    if not_applicable:
        ui.note(f"SLOs that do not apply to a {target.kind} target, left out: "
                f"{', '.join(s.text for s in not_applicable)}")
    sweep = Sweep(cfg, env, target, workload, kind, Gate(cfg.gate, cfg.seed), experiment_id, ui)
    top = int(max(cfg.benchmark.concurrency))
    book, keys, resume, why = _open_ledger(sweep, [n for n, _ in rungs])
    outcomes = ledger.restore(resume, kind, sweep.scores) if resume else []
    champion = next((o for o in reversed(outcomes) if o.verdict.accepted), None)
    sweep_id = resume.sweep_id if resume else time.strftime("%Y%m%d-%H%M%S")
    sweep.logs = data_dir / "logs" / f"{tracking.slug(str(cfg.tracking.experiment))}--{sweep_id}"
    with tracking.run(f"sweep-{sweep_id}", experiment_id, run_id=resume.parent_run_id if resume else None,
                      tags={"roi.sweep": sweep_id, "roi.target": target.name, "roi.kind": "sweep",
                            "roi.profile": str(cfg.get("profile_name", "")), "git_commit": tracking.git_commit(),
                            "hardware": "cuda" if env.cuda else "cpu"}) as parent, GracefulStop() as stop:
        book.begin(parent.info.run_id, sweep_id, resume.kept if resume else [])   # before anything else is logged
        _record_start(resume, why, sweep, outcomes, top)
        if not_applicable:
            tracking.set_tag("roi.slos.not_applicable", ", ".join(s.text for s in not_applicable))
        for name, opt in rungs[len(outcomes):]:
            if stop.requested:
                break
            outcome = _climb(name, opt, champion, sweep, book, keys[name])
            outcomes.append(outcome)
            if outcome.verdict.accepted:
                champion = outcome
            book.done(_ledger_entry(outcome), {"outcomes": {o.name: o for o in outcomes},
                                               "reference": kind.reference, "scores": sweep.scores})
            ui.rung_done(outcome, top)
        if stop.requested and len(outcomes) < len(rungs):
            book.finish("interrupted")
            tracking.set_tag("roi.interrupted", f"stopped by Ctrl-C after {outcomes[-1].name if outcomes else 'no rung'}"
                                                f"; running the same sweep again resumes it")
            raise SweepInterrupted(f"stopped after {len(outcomes)} of {len(rungs)} rungs, each recorded; run the "
                                   f"same command again to resume from {rungs[len(outcomes)][0]}")
        tracking.set_tags({"roi.champion_run": champion.run_id if champion else "",
                         "roi.champion_rung": champion.name if champion else ""})
        if champion and champion.capacity:
            mlflow.log_metrics(champion.capacity.to_metrics())
            tracking.log_text(champion.capacity.to_markdown(), "capacity/plan.md")
        _diagnose(outcomes, champion, sweep)
        tracking.log_text(_markdown_table(outcomes, top), "summary.md")
        _log_plots(outcomes, champion, cfg)
    book.finish("finished")     # after the parent run ended: a kill before this redoes only the closing steps
    return SweepResult(parent.info.run_id, experiment_id, outcomes, champion)


def _open_ledger(sweep: Sweep, names: list[str]):
    """(ledger, rung keys, what an unfinished run of the same sweep left or None, why)."""
    cfg = sweep.cfg
    key = ledger.sweep_key(cfg, tracking.environment())
    book = Ledger(Path(cfg.data_dir), str(cfg.tracking.experiment), sweep.target.name, key)
    book.lock()
    keys = ledger.rung_keys(cfg, names, key)
    resume, why = book.resumable(keys) if cfg.resume else (None, "resume=false")
    if resume and tracking.run_status(resume.parent_run_id) is None:
        resume, why = None, f"the earlier sweep's run {resume.parent_run_id} is gone from the store"
    return book, keys, resume, why


def _record_start(resume, why: str, sweep: Sweep, kept: list[RungOutcome], top: int) -> None:
    if not resume:
        tracking.log_config(sweep.cfg)
        tracking.write_json(tracking.environment(), "env.json")
        return
    sweep.ui.note(why)
    ledger.mark_stale(resume, sweep.experiment_id)
    resumed_at = time.strftime("%Y-%m-%dT%H-%M-%S")
    tracking.set_tag("roi.resumed", f"{resumed_at}: {why}")
    # params stay the first attempt's (MLflow keeps them immutable); a changed rung shows in this copy
    tracking.log_config(sweep.cfg, f"config/resumed-{resumed_at}.yaml", params=False)
    for outcome in kept:
        sweep.ui.rung_done(outcome, top)


def _ledger_entry(outcome: RungOutcome) -> dict:
    cand = outcome.candidate
    return {"verdict": outcome.verdict.status, "reason": outcome.verdict.reason[:2000],
            "recipe": cand.describe() if cand else {}, "model_dir": str(cand.target.model_dir) if cand else ""}


def _climb(name, opt, champion, sweep: Sweep, book: Ledger, key: str) -> RungOutcome:
    """Skipped rungs are decided here; a rung that applies is built, measured and gated in its own child
    process (conf/isolation), so a crash, an out-of-memory or a hang fails the rung, not the sweep."""
    tags = {"roi.rung": name, "roi.kind": "rung", "roi.cost": opt.cost,
            "roi.champion_before": champion.run_id if champion else ""}
    with tracking.run(name, sweep.experiment_id, nested=True, tags=tags) as run:
        book.started(name, key, run.info.run_id)
        outcome = RungOutcome(name, Verdict("failed", "not run"), run_id=run.info.run_id, champion_before=champion)
        try:
            current = champion.candidate if champion else Candidate(sweep.target)
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
                criteria += _soak(engine, outcome.bench, criteria, sweep, name)
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


def _soak(engine, bench: BenchmarkReport, criteria: list[Criterion], sweep: Sweep, name: str) -> list[Criterion]:
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


def _log_plots(outcomes: list[RungOutcome], champion: RungOutcome | None, cfg: DictConfig) -> None:
    from experiments import report

    obj = cfg.gate.objective
    level = int(max(cfg.benchmark.concurrency)) if obj.concurrency == "max" else int(obj.concurrency)
    mlflow.log_figure(report.waterfall(outcomes, obj.metric, obj.stat, level), "plots/ladder_waterfall.png")
    mlflow.log_figure(report.latency_vs_load(outcomes[0], champion), "plots/latency_vs_concurrency.png")
    mlflow.log_figure(report.pareto(outcomes, obj.metric, obj.stat, level), "plots/pareto_latency_accuracy.png")


def _diagnose(outcomes: list[RungOutcome], champion: RungOutcome | None, sweep: Sweep) -> None:
    """The seed's three-layer drill-down (experiments/diagnose.py): tags `roi.diagnosis` and
    `roi.recommended_next_rung` on every measured rung's run, and on the sweep's run for the champion, whose
    decode step is profiled too; a profiler that fails costs the table, not the sweep."""
    from experiments import diagnose, roofline

    cfg = sweep.cfg
    rules, hardware = cfg.diagnosis, roofline.Hardware.from_conf(cfg.hardware)   # local CPU: measured once, here
    tried, names = {o.name: o.verdict.status for o in outcomes}, [o.name for o in outcomes]
    client, found = mlflow.tracking.MlflowClient(), {}
    for o in outcomes:
        if o.bench is None or o.candidate is None or not o.run_id:
            continue
        try:
            found[o.name] = diagnose.diagnose(o.bench, diagnose.place_on_roofline(o.candidate, cfg.target.workload,
                                              hardware), rules, o.candidate.rungs, tried, names)
            diagnose.log_to_run(client, o.run_id, found[o.name])
        except Exception as exc:  # noqa: BLE001  (a diagnosis that breaks is recorded, the sweep goes on)
            log.exception("diagnosing %s failed", o.name)
            client.set_tag(o.run_id, "roi.diagnosis", scrub_text(f"failed: {type(exc).__name__}: {str(exc)[:400]}"))
    if champion is None or champion.name not in found:
        return
    placed = diagnose.place_on_roofline(champion.candidate, cfg.target.workload, hardware)
    if placed is None:
        tracking.set_tag("roi.diagnosis.model_layer", "not placed: the roofline model counts a decoder's layers")
    else:
        _diagnose_model_layer(placed)
    profile = _profile_champion(champion, sweep)
    result = replace(found[champion.name], profile=profile)
    tracking.set_tags(result.tags())
    mlflow.log_metrics(result.to_metrics())
    tracking.log_text(result.to_markdown(), "diagnosis/diagnosis.md")
    sweep.ui.note(f"diagnosis of {champion.name}: {result.tag}\n  recommended next rung: {result.next_rung}")


def _profile_champion(champion: RungOutcome, sweep: Sweep):
    """The champion's decode step under its engine's profiler; None (with the reason tagged) when there is no
    decode step or the profiler fails — that costs the table, not the sweep."""
    cfg, rules = sweep.cfg, sweep.cfg.diagnosis
    if not champion.candidate.target.decodes:
        tracking.set_tag("roi.diagnosis.framework_profile", "not applicable: the profile is of a decode step, and "
                                                          "an encoder has none")
        return None
    try:
        with sweep.ui.stage(f"diagnosis: profiling {champion.name}'s decode step"):
            ids = [t for p in sweep.workload.prompts for t in p.token_ids][:int(rules.profile.prompt_tokens)]
            job = (champion.candidate, int(cfg.threads), Path(cfg.cache_dir) / "artefacts", ids,
                   int(rules.profile.decode_steps))
            if not cfg.isolation.enabled:
                profile = _profile_decode(*job)
            else:   # a profiler that crashes costs the table, not the sweep (nor every resume of it)
                done = isolation.run(_profile_decode, job, isolation.Limits.for_rung(cfg.isolation, "diagnosis"),
                                     sweep.logs / "diagnosis-profile.log")
                if done.failure:
                    raise RuntimeError(done.failure)
                profile = done.value
        tracking.log_text(profile.to_markdown(int(rules.profile.top_ops)), "diagnosis/framework_profile.md")
        mlflow.log_metrics(profile.to_metrics())
        return profile
    except Exception as exc:  # noqa: BLE001  (the diagnosis says what it could not do)
        log.exception("profiling the champion failed")
        tracking.set_tag("roi.diagnosis.framework_profile", f"failed: {type(exc).__name__}: {str(exc)[:400]}")
        return None


def _profile_decode(cand: Candidate, threads: int, artefacts: Path, ids: list[int], steps: int):
    from experiments import profiling

    engine = build_engine(cand, threads, artefacts)
    try:
        return profiling.profile_decode(engine, ids, steps)
    finally:
        engine.close()


def _diagnose_model_layer(report) -> None:
    """The champion on the roofline of the configured hardware (the seed's model-layer drill-down)."""
    from experiments import roofline

    mlflow.log_metrics(report.to_metrics())
    mlflow.log_figure(roofline.plot(report), "diagnosis/roofline.png")
    tracking.log_text(report.to_markdown(), "diagnosis/roofline.md")
    tracking.set_tag("roi.diagnosis.model_layer", report.summary()[:5000])


def _log_criteria(criteria: tuple[Criterion, ...]) -> None:
    for c in criteria:
        mlflow.log_metrics({f"gate/{c.name}/{k}": v for k, v in c.numbers.items()})
        tracking.set_tag(f"roi.gate.{c.name}", f"{'pass' if c.passed else 'FAIL'}: {c.detail}"[:5000])


def _markdown_table(outcomes: list[RungOutcome], top: int) -> str:
    columns = RungOutcome.columns(outcomes[0].candidate is None or outcomes[0].candidate.target.decodes, top)
    rows = ["| rung | verdict | " + " | ".join(h for _, h, _ in columns) + " | reason |",
            "|---|---|" + "---|" * len(columns) + "---|"]
    for o in outcomes:
        s = o.summary(top)
        cells = " | ".join((f % s[k]) if k in s else "–" for k, _, f in columns)
        rows.append(f"| {o.name} | {o.verdict.status} | {cells} | {o.verdict.reason} |")
    return "\n".join(rows) + "\n"
