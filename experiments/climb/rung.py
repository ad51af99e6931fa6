"""One rung: skipped with its reason, or applied, built, measured and gated against the champion in a child
process of its own, everything logged to the rung's MLflow run."""
from __future__ import annotations

import logging
from dataclasses import replace

from experiments.analyse import memory_fit
from experiments.analyse.capacity import plan
from experiments.climb import contender, rounds, scores, soaking
from experiments.climb.sweep import Sweep
from experiments.core.errors import ConfigError
from experiments.core.names import Tag
from experiments.judge.gate import Verdict
from experiments.measure import isolation
from experiments.record import rung_log, tracking
from experiments.record.console import SweepConsole, quiet_libraries
from experiments.record.ledger import Ledger
from experiments.record.outcome import RungOutcome
from optimizers.baseline import EagerBaseline
from optimizers.placement import placed

log = logging.getLogger(__name__)


def climb(name, opt, champion, sweep: Sweep, book: Ledger, key: str) -> RungOutcome:
    """Skipped rungs are decided here; a rung that applies is built, measured and gated in its own child
    process (conf/isolation), so a crash, an out-of-memory or a hang fails the rung, not the sweep."""
    tags = {Tag.RUNG: name, Tag.KIND: "rung", Tag.COST: opt.cost,
            Tag.CHAMPION_BEFORE: champion.run_id if champion else ""}
    with tracking.run(name, sweep.experiment_id, nested=True, tags=tags) as run:
        book.started(name, key, run.info.run_id)
        outcome = RungOutcome(name, Verdict("failed", "not run"), run_id=run.info.run_id, champion_before=champion)
        try:
            device = sweep.cfg.target.get("device", "auto")
            current = champion.candidate if champion else placed(sweep.target, device, sweep.env)
            opt.observe(champion)
            held = opt.resident(current)
            reason = opt.check(sweep.env, current) or (memory_fit.refusal(held, _memory_setting(sweep.cfg))
                                                       if held else None)
            if champion is None and not isinstance(opt, EagerBaseline):
                outcome.verdict = Verdict("skipped", "no champion to compare with: the baseline did not complete")
            elif reason:
                outcome.verdict = Verdict("skipped", f"not applicable here: {reason}")
            else:
                if opt.decision:
                    rung_log.note(Tag.DECISION, opt.decision)
                outcome = _challenge_isolated(name, opt, champion, current, sweep, run.info.run_id, book)
        except ConfigError:
            raise
        except Exception as exc:  # a rung that breaks is a verdict, not the end of the sweep
            log.exception("rung %s failed", name)
            outcome.verdict = Verdict("failed", f"{type(exc).__name__}: {str(exc)[:400]}")
        rung_log.log_verdict(outcome, champion)
    return outcome


def _challenge_isolated(name, opt, champion, current, sweep: Sweep, run_id: str, book: Ledger) -> RungOutcome:
    iso = sweep.cfg.isolation
    alone = replace(champion, champion_before=None) if champion else None   # not the whole history
    if not iso.enabled:
        outcome, reference, known = _challenge(name, opt, alone, current, sweep, run_id)
    else:
        limits = isolation.Limits.for_rung(iso, name)
        log_path = sweep.logs / f"{name}-{run_id[:8]}.log"   # a redone rung's log is its own
        done = isolation.run(_challenge_in_child, (name, opt, alone, current, replace(sweep, ui=None), run_id),
                             limits, log_path, on_start=book.child)
        rung_log.log_isolation(done, limits, log_path)
        if done.failure:
            return RungOutcome(name, Verdict("failed", done.failure), run_id=run_id, champion_before=champion)
        outcome, reference, known = done.value
    if sweep.scorer.reference is None:
        sweep.scorer.reference = reference           # the baseline's: fidelity of every later rung is against it
    sweep.scores.update(known)
    if champion is not None and champion.candidate is not None:   # its scores, completed by this rung's gate?
        champion.accuracy = sweep.scores.get(contender.numerics_key(champion.candidate), [champion.accuracy])[0]
    if champion is not None and outcome.champion_bench is not None:  # its recorded run, measured again by this gate
        champion.bench = outcome.champion_bench
        rung_log.log_recorded_again(champion.bench, sweep.gate.objective_concurrency(champion.bench), champion.run_id)
    outcome.champion_before = champion
    return outcome


def _challenge_in_child(name, opt, champion, current, sweep: Sweep, run_id: str):
    """The rung's own process: its console, and the rung's MLflow run picked up by id."""
    quiet_libraries()
    sweep.ui = SweepConsole()
    with tracking.attach(str(sweep.cfg.tracking.uri), run_id):
        return _challenge(name, opt, champion, current, sweep, run_id)


def _challenge(name, opt, champion, current, sweep: Sweep, run_id: str):
    """Apply one rung, then measure and gate it, logging to the active (rung) run. Every engine is built and
    measured in a process of its own (experiments/climb/contender.py); this one only orchestrates. Returns
    (outcome, the baseline's reference scores, the score cache)."""
    cfg = sweep.cfg
    outcome = RungOutcome(name, Verdict("failed", "not run"), run_id=run_id)
    apart = contender.Apart(isolation.Limits.for_rung(cfg.isolation, name), sweep.logs, f"{name}-{run_id[:8]}")
    try:
        with sweep.ui.stage(f"{name}: applying the rung ({opt.cost} cost)") as st:
            opt.on_progress = st.progress
            try:
                outcome.candidate = cand = opt.apply(current)
            finally:
                opt.on_progress = None
        if too_big := memory_fit.refusal(cand, _memory_setting(cfg)):   # before anything is built
            outcome.verdict = Verdict("skipped", f"not applicable here: {too_big}")
            return outcome, sweep.scorer.reference, sweep.scores
        rung_log.log_applied(cand, opt.applied(), cand.target.model_dir != current.target.model_dir,
                             contender.WHAT_WAS_DONE)
        measured = _measure(cand, sweep, name, apart)
        outcome.bench, outcome.accuracy, outcome.fidelity = measured.bench, measured.accuracy, measured.fidelity
        rung_log.log_measurements(outcome)
        outcome.capacity = _capacity_plan(outcome.bench, cfg.capacity, cand.recipe.devices_per_replica)
        if champion is None:
            outcome.verdict = Verdict("accepted", "baseline: the first champion, measured as is")
        else:
            aim = opt.aim_for(cand)
            rung_log.note(Tag.AIM, aim)
            judged = rounds.performance(champion, outcome.bench, cand, sweep, name, apart, aim)
            criteria = judged.criteria
            if judged.challenger is not outcome.bench:      # its recorded run measured again: the first disturbed
                outcome.bench = judged.challenger
                rung_log.log_recorded_again(outcome.bench, sweep.gate.objective_concurrency(champion.bench))
            if judged.champion is not champion.bench:
                outcome.champion_bench = judged.champion
            drift = sweep.scorer.judge(outcome.fidelity)   # fidelity (and generation agreement) vs the baseline
            if not opt.fidelity_gated:
                rung_log.note(Tag.FIDELITY, "recorded, not gated for this rung: " + "; ".join(c.detail for c in drift))
                drift = []
            criteria += scores.accuracy_criteria(champion, outcome, sweep, name, apart,
                                                 pursue=all(c.passed or c.undecided for c in criteria + drift))
            criteria += drift
            criteria += soaking.soaked(cand, outcome.bench, criteria, sweep, name, run_id, apart)
            outcome.verdict = Verdict.from_criteria(criteria)
            rung_log.log_criteria(outcome.verdict.criteria)
    except ConfigError:
        raise
    except Exception as exc:  # a rung that breaks is a verdict, not the end of the sweep
        log.exception("rung %s failed", name)
        outcome.verdict = Verdict("failed", f"{type(exc).__name__}: {str(exc)[:400]}")
    return outcome, sweep.scorer.reference, sweep.scores


def _memory_setting(cfg):
    return cfg.get("hardware", {}).get("memory_bytes")


def _measure(cand, sweep: Sweep, name: str, apart: contender.Apart) -> contender.Measured:
    """The candidate's load ladder, accuracy and fidelity, measured in a process of its own; logged here."""
    with sweep.ui.stage(f"{name}: {cand.recipe.engine} engine: build, load ladder and scores, in a process "
                        f"of its own") as st:
        measured = contender.measure(cand, sweep, name, apart, on_progress=st.relayed)
    rung_log.log_build(measured)
    sweep.ui.levels(name, measured.bench)
    if sweep.scorer.reference is None:
        sweep.scorer.reference = measured.reference
    if measured.scores_reused_from:
        sweep.ui.note(f"{name}: accuracy and fidelity as measured on {measured.scores_reused_from} "
                      f"(same model numerics)")
    else:
        sweep.scores[contender.numerics_key(cand)] = (measured.accuracy, measured.fidelity, name)
    return measured


def _capacity_plan(bench, cfg_capacity, devices_per_replica: int):
    """The plan this rung's measurements imply, or None where no level met the tier (said, not invented)."""
    try:
        result = plan(bench, cfg_capacity, devices_per_replica)
    except ValueError as exc:
        rung_log.log_capacity(None, cfg_capacity, str(exc))
        return None
    rung_log.log_capacity(result, cfg_capacity)
    return result
