"""One rung: skipped with its reason, or applied, built, measured and gated against the champion in a child
process of its own, everything logged to the rung's MLflow run."""
from __future__ import annotations

import functools
import logging
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from omegaconf import DictConfig

from experiments.analyse import memory_fit
from experiments.analyse.capacity import plan
from experiments.climb import contender
from experiments.core.errors import ConfigError
from experiments.core.names import Tag
from experiments.core.recipe import Candidate, Env, Target
from experiments.core.reports import BenchmarkReport
from experiments.judge.accuracy import AccuracyReport, mlflow_name
from experiments.judge.gate import Criterion, Gate, Verdict
from experiments.measure import interleaved, isolation, soak
from experiments.record import benchmark_log, rung_log, tracking
from experiments.record.console import SweepConsole, quiet_libraries
from experiments.record.ledger import Ledger
from experiments.record.outcome import RungOutcome
from experiments.serving import build_engine
from experiments.serving.servers import serve
from experiments.targets.kinds.base import Scorer
from experiments.targets.workload import Workload
from optimizers.baseline import EagerBaseline
from optimizers.placement import placed

log = logging.getLogger(__name__)


@dataclass
class Sweep:
    """What every rung of one sweep shares: config, machine, target, load, data, gate, where to record."""
    cfg: DictConfig
    env: Env
    target: Target
    workload: Workload
    scorer: Scorer                              # the target kind's: the workload, how answers are scored
    gate: Gate
    experiment_id: str
    ui: SweepConsole
    scores: dict = field(default_factory=dict)  # numerics key -> (accuracy, fidelity, rung that measured them)
    logs: Path | None = None                    # the rungs' child-process logs


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
                    tracking.set_tag(Tag.DECISION, opt.decision[:5000])
                outcome = _challenge_isolated(name, opt, champion, current, sweep, run.info.run_id, book)
        except ConfigError:
            raise
        except Exception as exc:  # a rung that breaks is a verdict, not the end of the sweep
            log.exception("rung %s failed", name)
            outcome.verdict = Verdict("failed", f"{type(exc).__name__}: {str(exc)[:400]}")
        tracking.set_tags({Tag.VERDICT: outcome.verdict.status, Tag.REASON: outcome.verdict.reason[:5000]})
        if outcome.verdict.status != "accepted":
            tracking.set_tag(Tag.REVERTED_TO, champion.run_id if champion else "")
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
        tracking.log_metrics({"isolation/peak_rss_bytes": done.peak_rss_bytes, "isolation/seconds": done.seconds})
        tracking.set_tag(Tag.ISOLATION, f"child process, limits {limits.describe()}, log {log_path}")
        if log_path.exists() and log_path.stat().st_size:
            tracking.log_text(log_path.read_text(errors="replace")[-200_000:], "logs/rung.log")
        if done.failure:
            return RungOutcome(name, Verdict("failed", done.failure), run_id=run_id, champion_before=champion)
        outcome, reference, scores = done.value
    if sweep.scorer.reference is None:
        sweep.scorer.reference = reference           # the baseline's: fidelity of every later rung is against it
    sweep.scores.update(scores)
    if champion is not None and champion.candidate is not None:   # its scores, completed by this rung's gate?
        champion.accuracy = sweep.scores.get(contender.numerics_key(champion.candidate), [champion.accuracy])[0]
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
    cfg, gate = sweep.cfg, sweep.gate
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
        if cand.target.model_dir != current.target.model_dir:   # the rung made a new model
            tracking.set_tag(Tag.MODEL_DIR, str(cand.target.model_dir))
        tracking.log_params(tracking.flatten({"recipe": cand.describe()}))
        tracking.log_params(opt.applied())
        tracking.set_tag(Tag.MEASUREMENT, contender.WHAT_WAS_DONE)
        measured = _measure(cand, sweep, name, apart)
        outcome.bench, outcome.accuracy, outcome.fidelity = measured.bench, measured.accuracy, measured.fidelity
        rung_log.log_measurements(outcome)
        outcome.capacity = _capacity_plan(outcome.bench, cfg.capacity, cand.recipe.devices_per_replica)
        if champion is None:
            outcome.verdict = Verdict("accepted", "baseline: the first champion, measured as is")
        else:
            criteria = _performance(champion, outcome.bench, cand, sweep, name, apart)
            if cfg.gate.get("slos_still_met", True):
                criteria.append(gate.slos(champion.bench, outcome.bench))
            drift = sweep.scorer.judge(outcome.fidelity)   # fidelity (and generation agreement) vs the baseline
            if not opt.fidelity_gated:
                tracking.set_tag(Tag.FIDELITY, "recorded, not gated for this rung: "
                                                 + "; ".join(c.detail for c in drift))
                drift = []
            criteria += _accuracy(champion, outcome, sweep, name, apart,
                                  pursue=all(c.passed for c in criteria + drift))
            criteria += drift
            criteria += _soak(cand, outcome.bench, criteria, sweep, name, run_id, apart)
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
    tracking.log_metric("artefact_bytes", measured.artefact_bytes)
    tracking.log_metric("weight_bits", measured.weight_bits)
    if measured.build_seconds is not None:
        tracking.log_metric("build_seconds", measured.build_seconds)
        tracking.set_tag(Tag.ARTEFACT_REUSED, str(measured.artefact_reused))
    if measured.server:
        rung_log.log_server(measured.server)
    sweep.ui.levels(name, measured.bench)
    if sweep.scorer.reference is None:
        sweep.scorer.reference = measured.reference
    if measured.scores_reused_from:
        tracking.set_tag(Tag.SCORES_REUSED_FROM, measured.scores_reused_from)
        sweep.ui.note(f"{name}: accuracy and fidelity as measured on {measured.scores_reused_from} "
                      f"(same model numerics)")
    else:
        sweep.scores[contender.numerics_key(cand)] = (measured.accuracy, measured.fidelity, name)
    return measured


def _performance(champion: RungOutcome, bench: BenchmarkReport, cand: Candidate, sweep: Sweep, name: str,
                 apart: contender.Apart) -> list[Criterion]:
    """The champion re-measured beside the challenger in rounds of a balanced, drawn order (gate.interleaved),
    each side measured where it is the only engine alive; or, with rounds: 0, compared with its recorded run. With rounds, the
    measurement's consistency is a criterion too: measured again once if it fails, never accepted on it."""
    cfg, gate = sweep.cfg, sweep.gate
    rounds_cfg = cfg.gate.interleaved
    if not rounds_cfg.rounds:
        return [gate.performance(champion.bench, bench)]
    if rounds_cfg.get("skip_without_recorded_gain", True):
        decided = gate.without_rounds(champion.bench, bench)
        if decided:
            tracking.set_tag(Tag.GATE_INTERLEAVED, "not run: the recorded runs show no gain, which no rounds "
                                                   "could turn into an acceptance")
            return [decided]
    c = gate.objective_concurrency(champion.bench)
    rounds = _rounds(champion.candidate, cand, sweep, name, apart, c, 1)
    consistency = gate.consistency(rounds, champion.bench, bench)
    if not consistency.passed:
        tracking.set_tag(Tag.GATE_FIRST_MEASUREMENT, f"inconsistent, measured again: {consistency.detail}"[:5000])
        rung_log.log_rounds(rounds, cfg.gate.objective, "gate/first_interleaved_rounds.csv", "gate/first_round_ratio")
        rounds = _rounds(champion.candidate, cand, sweep, name, apart, c, 2)
        consistency = gate.consistency(rounds, champion.bench, bench)
    rung_log.log_rounds(rounds, cfg.gate.objective, "gate/interleaved_rounds.csv", "gate/round_ratio")
    tracking.set_tag(Tag.GATE_INTERLEAVED,
                     contender.ROUNDS_DONE[bool(rounds_cfg.get("fresh_build_per_run", False))])
    return [gate.interleaved(rounds), consistency]


def _rounds(champion: Candidate, cand: Candidate, sweep: Sweep, name: str, apart: contender.Apart, c: int,
            attempt: int) -> interleaved.Rounds:
    cfg = sweep.cfg
    why = "" if attempt == 1 else " (again: the first was inconsistent)"
    rounds_cfg = cfg.gate.interleaved
    threads, artefacts = int(cfg.threads), Path(cfg.cache_dir) / "artefacts"
    load = interleaved.load_config(cfg.benchmark, rounds_cfg, c)
    looks = sweep.gate.round_looks()
    most = looks[-1]
    upto = f"{looks[0]} to {most} rounds, more while undecided," if len(looks) > 1 else f"{most} rounds"
    with sweep.ui.stage(f"{name}: champion and challenger in {upto} at c={c}{why}") as st:
        # planned: both sides' runs of `seconds` each; the rate seen (warm-up and drain included) takes over
        planned = 2 * float(rounds_cfg.seconds) * most

        def on_round(r):
            st.progress(r, most, "rounds", planned_s=planned)

        builds = {who: functools.partial(build_engine, side, threads, artefacts)
                  for who, side in (("champion", champion), ("challenger", cand))}
        with contender.round_runs(builds, bool(rounds_cfg.get("fresh_build_per_run", False)),
                                  sweep.workload, load, c, cfg.gate.confidence, apart, attempt,
                                  on_build=lambda k, n: st.progress(k, n, "builds, each in a process of its own")
                                  ) as runs:
            # the order's seed: the sweep's, the rung and the attempt (a second measurement draws anew)
            seed = (int(cfg.seed), zlib.crc32(name.encode()), attempt)
            return interleaved.measure(runs, most, c, on_round, seed, looks[:-1], sweep.gate.rounds_decided,
                                       rounds_cfg.get("budget_s"))


def _soak(cand, bench, criteria, sweep: Sweep, name: str, run_id: str, apart: contender.Apart) -> list[Criterion]:
    if _soak_skipped(criteria, sweep.cfg):
        return soak_criterion(None, bench, criteria, sweep, name)      # tags why; builds nothing
    with sweep.ui.stage(f"{name}: soak, on a fresh build in a process of its own") as st:
        return contender.soaked(soak_criterion, cand, bench, criteria, sweep, name, run_id, apart,
                                on_progress=st.relayed)


def _accuracy(champion: RungOutcome, outcome: RungOutcome, sweep: Sweep, name: str, apart: contender.Apart,
              pursue: bool) -> list[Criterion]:
    """The accuracy criteria. Where the first look of two leaves one undecided, both sides' scores are
    completed (each in a process of its own; the completed scores serve later rungs too) and the undecided are
    judged at the last look; a criterion the first look decided stays as it was. Nothing more is scored once
    another criterion, or an accuracy criterion, has failed: the rung is rejected whatever the rest would say."""
    challenger = outcome.accuracy
    if any(set(c.ids) - set(k.ids) for k, c in zip(champion.accuracy, challenger)):
        # the challenger's are scores another rung's gate completed: the champion's must pair with them, or,
        # for a rung already rejected, the challenger's are judged on the champion's documents
        if pursue:
            champion.accuracy = _completed(champion, sweep, name, "champion", apart)
        else:
            challenger = [c.only(k.ids) for k, c in zip(champion.accuracy, challenger)]
    criteria = _accuracy_criteria(sweep.gate, champion.accuracy, challenger)
    if not any(c.undecided for c in criteria):
        return criteria
    if not pursue or any(not c.passed and not c.undecided for c in criteria):
        why = "another criterion failed" if not pursue else "another accuracy criterion failed"
        return [replace(c, detail=f"{c.detail}; the other documents were not scored: {why}")
                if c.undecided else c for c in criteria]
    outcome.accuracy = _completed(outcome, sweep, name, "challenger", apart)
    rung_log.log_accuracy(outcome.accuracy)
    champion.accuracy = _completed(champion, sweep, name, "champion", apart)
    last = _accuracy_criteria(sweep.gate, champion.accuracy, outcome.accuracy)
    return [new if old.undecided else old for old, new in zip(criteria, last)]


def _completed(side: RungOutcome, sweep: Sweep, name: str, who: str, apart: contender.Apart) -> list:
    key = contender.numerics_key(side.candidate)
    known = sweep.scores.get(key, [side.accuracy])[0]           # completed by an earlier rung's gate?
    if not any(r.missing() for r in known):
        return known
    with sweep.ui.stage(f"{name}: the {who}'s other documents, in a process of its own") as st:
        done = contender.scored_more(side.candidate, known, sweep, name, who, apart, on_progress=st.relayed)
    if key in sweep.scores:
        _, fidelity, by = sweep.scores[key]
        sweep.scores[key] = (done, fidelity, by)
    return done


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
    why = _soak_skipped(criteria, cfg)
    if why:
        tracking.set_tag(Tag.SOAK, f"skipped: {why}")
        return []
    obj = cfg.gate.objective
    fallback = int(max(cfg.benchmark.concurrency)) if obj.concurrency == "max" else int(obj.concurrency)
    clients, why = soak.concurrency_for(cfg.soak.concurrency, bench.capacity, fallback)
    total = cfg.soak.warmup_s + cfg.soak.duration_s
    with sweep.ui.stage(f"{name}: soak at c={clients} ({why}) for {total:g} s") as st:
        server = serve(engine)
        try:
            windows = sum(soak.window_counts(cfg.soak))
            seen = []
            st.progress(0, windows, "soak", f"windows of {cfg.soak.window_s:g} s", planned_s=total)
            report = soak.run_soak(server, sweep.workload, cfg.soak, clients,
                                   on_window=lambda w: (seen.append(w), st.progress(len(seen), windows)))
        finally:
            server.close()
    benchmark_log.log_soak(report)
    crit = report.criterion()
    tracking.set_tag(Tag.SOAK, f"ran at c={clients} ({why}): {'clean' if crit.passed else 'NOT clean'}")
    return [crit]


def _soak_skipped(criteria: list[Criterion], cfg) -> str | None:
    failed = [c.name for c in criteria if not c.passed]
    if failed:
        return f"{', '.join(failed)} failed first"
    return None if cfg.soak.enabled else "soak.enabled=false"


def _capacity_plan(bench, cfg_capacity, devices_per_replica: int):
    """The plan this rung's measurements imply, or None where no level met the tier (said, not invented)."""
    try:
        result = plan(bench, cfg_capacity, devices_per_replica)
    except ValueError as exc:
        rung_log.log_capacity(None, cfg_capacity, str(exc))
        return None
    rung_log.log_capacity(result, cfg_capacity)
    return result
