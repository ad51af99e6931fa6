"""The accuracy criteria, sequentially: judged on the first look's documents, and both sides' scores completed
only where the first look left a criterion undecided (judge/sequential.py says when that is)."""
from __future__ import annotations

from dataclasses import replace

from experiments.climb import contender
from experiments.climb.sweep import Sweep
from experiments.judge.accuracy import AccuracyReport, mlflow_name
from experiments.judge.gate import Criterion, Gate
from experiments.record import rung_log
from experiments.record.outcome import RungOutcome


def accuracy_criteria(champion: RungOutcome, outcome: RungOutcome, sweep: Sweep, name: str, apart: contender.Apart,
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
    criteria = _per_score(sweep.gate, champion.accuracy, challenger)
    if not any(c.undecided for c in criteria):
        return criteria
    if not pursue or any(not c.passed and not c.undecided for c in criteria):
        why = "another criterion failed" if not pursue else "another accuracy criterion failed"
        return [replace(c, detail=f"{c.detail}; the other documents were not scored: {why}")
                if c.undecided else c for c in criteria]
    outcome.accuracy = _completed(outcome, sweep, name, "challenger", apart)
    rung_log.log_accuracy(outcome.accuracy)
    champion.accuracy = _completed(champion, sweep, name, "champion", apart)
    last = _per_score(sweep.gate, champion.accuracy, outcome.accuracy)
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


def _per_score(gate: Gate, champion: list[AccuracyReport], challenger: list[AccuracyReport]) -> list[Criterion]:
    """One criterion per gated score; with several, each named after what tells it apart (the metric within
    one task, as recall@1 and @5; else the task) so none overwrites another's tag and numbers."""
    criteria = [gate.accuracy(c, n) for c, n in zip(champion, challenger)]
    if len(criteria) < 2:
        return criteria
    one_task = len({n.task for n in challenger}) < len(challenger)
    return [replace(c, name=mlflow_name(f"accuracy_{n.metric if one_task else n.task}").replace(".", "_"))
            for c, n in zip(criteria, challenger)]
