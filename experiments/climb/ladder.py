"""The ladder: champion vs challenger, rung by rung in ROI order; a rejected rung is reverted. Validation
(experiments/climb/validation.py) comes first, each rung is climbed by experiments/climb/rung.py, the diagnosis
and plots come after (experiments/climb/sweep_report.py)."""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig

from experiments.analyse import memory_fit
from experiments.climb.rung import climb
from experiments.climb.sweep import Sweep
from experiments.climb.sweep_report import diagnose_sweep, sweep_figures
from experiments.climb.validation import validate
from experiments.climb.versus_defaults import versus_defaults
from experiments.core.errors import ConfigError, SweepInterrupted, exception_line
from experiments.core.interrupts import GracefulStop
from experiments.core.names import Tag
from experiments.core.recipe import Env
from experiments.core.slo import applicable, parse_all
from experiments.judge.gate import Gate
from experiments.measure.machine_load import MachineLoad
from experiments.record import ledger, review, tracking
from experiments.record.ledger import Ledger
from experiments.record.outcome import RungOutcome, SweepResult, markdown_table
from experiments.record.ui import EXPERIMENT_KIND, ladder_view_url, run_url, save_ladder_view, ui_base
from experiments.targets import kinds
from experiments.targets.resolve import resolve
from optimizers.baseline import EagerBaseline
from optimizers.placement import placed, resolve_device


def run_sweep(cfg: DictConfig, ui) -> SweepResult:
    """Every check, then the target and how it is scored, then the rungs in order under the sweep's parent run
    (resumed where an unfinished run of the same sweep stopped), then the sweep's own records."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rungs = validate(cfg)
    env = _environment(cfg)
    sweep, not_applicable = _prepare(cfg, env, ui)
    load = MachineLoad.sample()
    if load.warning():
        ui.note(load.warning())
    top = int(max(cfg.benchmark.concurrency))
    book, keys, resume, why = _open_ledger(sweep, [n for n, _ in rungs])
    outcomes = ledger.restore(resume, sweep.scorer, sweep.scores) if resume else []
    sweep_id = resume.sweep_id if resume else time.strftime("%Y%m%d-%H%M%S")
    sweep.logs = Path(cfg.data_dir) / "logs" / f"{tracking.slug(str(cfg.tracking.experiment))}--{sweep_id}"
    with tracking.run(f"sweep-{sweep_id}", sweep.experiment_id, run_id=resume.parent_run_id if resume else None,
                      tags=_sweep_tags(sweep, sweep_id)) as parent, GracefulStop() as stop:
        book.begin(parent.info.run_id, sweep_id, resume.kept if resume else [])   # before anything else is logged
        _record_start(resume, why, sweep, outcomes, top)
        _tag_start(load, not_applicable, sweep.scorer)
        champion = _climb_rungs(rungs, outcomes, sweep, book, keys, stop, top)
        versus, champion = _versus_defaults(outcomes, champion, sweep, top)
        _record_end(outcomes, champion, sweep, f"ROI ladder: {sweep.target.name}, sweep {sweep_id}", top, versus)
    book.finish("finished")     # after the parent run ended: a kill before this redoes only the closing steps
    return replace(_result(sweep, parent.info.run_id, f"sweep-{sweep_id}", outcomes, champion),
                   versus_defaults=versus)


def _versus_defaults(outcomes: list[RungOutcome], champion: RungOutcome | None, sweep: Sweep,
                     top: int) -> tuple[str, RungOutcome | None]:
    """(versus_defaults' line, tagged on the sweep's run; the champion after it). A measurement that fails says so
    and ends nothing: the ladder's champion stands."""
    try:
        versus = versus_defaults(outcomes, champion, sweep, top)
    except Exception as exc:  # the sweep's verdicts stand without it
        return f"champion vs best default: not measured ({exception_line(exc)})", champion
    if versus.line:
        tracking.set_tag(Tag.VERSUS_DEFAULTS, versus.line)
    return versus.line, versus.champion


def _environment(cfg: DictConfig) -> Env:
    """The tracking store reachable and the baseline's device present, before the model is built."""
    tracking.probe(cfg.tracking)   # a bad tracking URI fails before the model is built; nothing created yet
    env = Env.detect()
    try:
        resolve_device(cfg.target.get("device", "auto"), env)
    except ValueError as exc:
        raise ConfigError(str(exc), "set target.device to auto, cpu or a CUDA device this machine has") from None
    return env


def _prepare(cfg: DictConfig, env: Env, ui) -> tuple[Sweep, list]:
    """The model built or loaded, its weights checked against memory, its kind's scorer and workload, the
    objective and SLOs checked against what that kind measures; then the experiment. (The sweep, the SLOs left
    out.)"""
    with ui.stage("target: building or loading the model") as st:
        target, texts, shipped_tasks = resolve(cfg.target, Path(cfg.cache_dir), Path(cfg.data_dir), ui.note,
                                               on_step=lambda done, total: st.progress(done, total, "training",
                                                                                       "steps"))
    # before the model is loaded: a baseline whose weights would not fit stops the sweep
    memory_fit.check_baseline(EagerBaseline().apply(placed(target, cfg.target.get("device", "auto"), env)),
                              cfg.get("hardware", {}).get("memory_bytes"))
    include_path = Path(cfg.accuracy.include_path) if cfg.accuracy.include_path else shipped_tasks
    scorer = kinds.for_target(cfg, target, texts, include_path)
    workload = scorer.workload()
    measured = kinds.kind_of(workload.kind).metrics
    if cfg.gate.objective.metric not in measured:
        raise ConfigError(f"gate.objective.metric {cfg.gate.objective.metric!r} is not measured for a {target.kind} "
                          f"target", f"use one of {measured}")
    for g in getattr(scorer, "gated", ()):
        ui.note(f"accuracy gate: {g.describe()}")
    _, not_applicable = applicable(parse_all(cfg.benchmark.slos), measured)
    if not_applicable:
        ui.note(f"SLOs that do not apply to a {target.kind} target, left out: "
                f"{', '.join(s.text for s in not_applicable)}")
    # only now, with the target's own data read (a built model's or a converted GGUF's prompts file included)
    experiment_id = tracking.connect(cfg.tracking)   # safe for parallel jobs
    tracking.client().set_experiment_tag(experiment_id, *EXPERIMENT_KIND)
    return Sweep(cfg, env, target, workload, scorer, Gate(cfg.gate, cfg.seed), experiment_id, ui), not_applicable


def _sweep_tags(sweep: Sweep, sweep_id: str) -> dict:
    return {Tag.SWEEP: sweep_id, Tag.TARGET: sweep.target.name, Tag.KIND: "sweep",
            Tag.PROFILE: str(sweep.cfg.get("profile_name", "")), "git_commit": tracking.git_commit(),
            "hardware": "cuda" if sweep.env.cuda else "cpu"}


def _tag_start(load: MachineLoad, not_applicable: list, scorer) -> None:
    tracking.set_tag(Tag.MACHINE_LOAD, f"at the start: {load.text()}")
    if not_applicable:
        tracking.set_tag(Tag.SLOS_NOT_APPLICABLE, ", ".join(s.text for s in not_applicable))
    if gated := getattr(scorer, "gated", None):
        tracking.set_tag(Tag.ACCURACY_METRIC, "; ".join(g.describe() for g in gated))


def _climb_rungs(rungs: list, outcomes: list[RungOutcome], sweep: Sweep, book: Ledger, keys: dict,
                 stop: GracefulStop, top: int) -> RungOutcome | None:
    """The rungs not yet climbed, in order, each against the champion so far; the champion at the end. A first
    Ctrl-C lets the running rung finish, then the sweep stops, resumable."""
    champion = next((o for o in reversed(outcomes) if o.verdict.accepted), None)
    measured_s = []                  # how long each rung that applied took: the estimate of what remains
    for name, opt in rungs[len(outcomes):]:
        if stop.requested:
            break
        sweep.ui.rung_start(len(outcomes) + 1, len(rungs), name, measured_s, len(outcomes))
        load = MachineLoad.sample()
        began = time.monotonic()
        outcome = climb(name, opt, champion, sweep, book, keys[name])
        if outcome.verdict.status != "skipped":
            measured_s.append(time.monotonic() - began)
        outcomes.append(outcome)
        if outcome.verdict.accepted:
            champion = outcome
        book.done(_ledger_entry(outcome), {"outcomes": {o.name: o for o in outcomes},
                                           "reference": sweep.scorer.reference, "scores": sweep.scores})
        tracking.mark_run(outcome.run_id, {review.DESCRIPTION: review.rung_description(outcome),
                                           Tag.MACHINE_LOAD: f"at the rung's start: {load.text()}"},
                          metrics=load.to_metrics())
        sweep.ui.rung_done(outcome, top)
    if stop.requested and len(outcomes) < len(rungs):
        book.finish("interrupted")
        tracking.set_tag(Tag.INTERRUPTED, f"stopped by Ctrl-C after {outcomes[-1].name if outcomes else 'no rung'}"
                                            f"; running the same sweep again resumes it")
        raise SweepInterrupted(f"stopped after {len(outcomes)} of {len(rungs)} rungs, each recorded; run the "
                               f"same command again to resume from {rungs[len(outcomes)][0]}")
    return champion


def _record_end(outcomes: list[RungOutcome], champion: RungOutcome | None, sweep: Sweep, title: str,
                top: int, versus: str = "") -> None:
    """On the sweep's run: the champion, its capacity plan, the diagnosis, the table, the plots and the review."""
    tracking.set_tags({Tag.CHAMPION_RUN: champion.run_id if champion else "",
                       Tag.CHAMPION_RUNG: champion.name if champion else ""})
    if champion and champion.capacity:
        tracking.log_metrics(champion.capacity.to_metrics())
        tracking.log_text(champion.capacity.to_markdown(), "capacity/plan.md")
    diagnose_sweep(outcomes, champion, sweep)
    tracking.log_text(markdown_table(outcomes, top) + (f"\n{versus}\n" if versus else ""), "summary.md")
    _log_review(outcomes, champion, sweep, title, top, versus)


def _result(sweep: Sweep, parent_id: str, view: str, outcomes: list[RungOutcome],
            champion: RungOutcome | None) -> SweepResult:
    """The sweep's saved ladder view in the UI, and where to look."""
    save_ladder_view(tracking.client(), sweep.experiment_id, view, parent_id,
                     kinds.kind_of(sweep.target.kind).key_metrics)
    base = ui_base(sweep.cfg.tracking)
    urls = (ladder_view_url(base, sweep.experiment_id, view), run_url(base, sweep.experiment_id, parent_id))
    return SweepResult(parent_id, sweep.experiment_id, outcomes, champion, urls)


def _log_review(outcomes: list[RungOutcome], champion: RungOutcome | None, sweep: Sweep, title: str,
                top: int, versus: str = "") -> None:
    """The plots, the HTML report and the sweep's description: what a reviewer opens first in the UI."""
    figures = sweep_figures(outcomes, champion, sweep.cfg)
    for path, fig in figures.items():
        tracking.log_figure(fig, path)
    tracking.log_text(review.html_report(title, outcomes, top, figures), "report.html")
    tracking.set_tag(review.DESCRIPTION, review.sweep_description(outcomes, champion, top, sweep.target.name,
                                                                  versus))


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
    tracking.set_tag(Tag.RESUMED, f"{resumed_at}: {why}")
    # params stay the first attempt's (MLflow keeps them immutable); a changed rung shows in this copy
    tracking.log_config(sweep.cfg, f"config/resumed-{resumed_at}.yaml", params=False)
    for outcome in kept:
        sweep.ui.rung_done(outcome, top)


def _ledger_entry(outcome: RungOutcome) -> dict:
    cand = outcome.candidate
    return {"verdict": outcome.verdict.status, "reason": outcome.verdict.reason[:2000],
            "recipe": cand.describe() if cand else {}, "model_dir": str(cand.target.model_dir) if cand else ""}
