"""The performance criterion: the champion measured again beside the challenger, in interleaved rounds of a
balanced, drawn order (gate.interleaved), or against its recorded run (rounds: 0)."""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from pathlib import Path

from experiments.climb import contender
from experiments.climb.sweep import Sweep
from experiments.core.names import Tag
from experiments.core.recipe import Candidate
from experiments.core.reports import BenchmarkReport
from experiments.judge import consistency as consistent
from experiments.judge import memory_saving, slo_verdict
from experiments.judge.gate import Criterion, Gate
from experiments.measure import interleaved
from experiments.record import rung_log
from experiments.record.outcome import RungOutcome
from experiments.serving import build_engine
from experiments.targets.workload import LADDER


@dataclass(frozen=True)
class Judged:
    """The performance criteria, and each side's recorded runs as judged: a run the gate measured again (its first
    disturbed) in place of the first."""
    criteria: list[Criterion]
    champion: BenchmarkReport
    challenger: BenchmarkReport


def performance(champion: RungOutcome, bench: BenchmarkReport, cand: Candidate, sweep: Sweep, name: str,
                apart: contender.Apart, aim: str = "speed") -> Judged:
    """The champion re-measured beside the challenger in rounds of a balanced, drawn order (gate.interleaved),
    each side measured where it is the only engine alive; or, with rounds: 0, compared with its recorded run.
    With rounds, the measurement's consistency is a criterion too: where it fails, the side that strayed has its
    recorded run measured again, then the rounds once more; still inconsistent, the criteria on those rounds are
    undecided, never accepted. A rung aiming at memory is judged on the memory it saves too, in the same runs;
    and every SLO (gate.slos_still_met) on the rounds at their level, on the recorded runs at the others."""
    cfg, gate = sweep.cfg, sweep.gate.aimed_at(aim)
    rounds_cfg = cfg.gate.interleaved
    slos = functools.partial(_slos, champion.bench, bench, cfg.gate)
    if not rounds_cfg.rounds:
        memory = [memory_saving.on_recorded(champion.bench, bench, gate)] if aim == "memory" else []
        return Judged([gate.performance(champion.bench, bench), *memory, *slos(None)], champion.bench, bench)
    if rounds_cfg.get("skip_without_recorded_gain", True):
        decided = gate.without_rounds(champion.bench, bench)
        if decided:
            rung_log.note(Tag.GATE_INTERLEAVED, "not run: the recorded runs show no gain, which no rounds "
                                                "could turn into an acceptance")
            return Judged([decided, *slos(None)], champion.bench, bench)
    c = gate.objective_concurrency(champion.bench)
    rounds = _rounds(champion, cand, sweep, gate, name, apart, c, 1)
    recorded = {"champion": champion.bench, "challenger": bench}
    consistency, again = gate.consistency(rounds, champion.bench, bench), None
    if not consistency.passed and cfg.benchmark.get("mode", "closed") == "closed":
        side = consistent.strayed(consistency)
        level = _recorded_again({"champion": champion.candidate, "challenger": cand}[side], sweep, name, apart, c,
                                side)
        recorded[side] = recorded[side].with_level(level)
        again = consistent.Remeasured.of(consistency, side)
        consistency = again.said(gate.consistency(rounds, recorded["champion"], recorded["challenger"]))
        rung_log.note(Tag.GATE_RECORDED_AGAIN, consistency.detail)
    if not consistency.passed:
        rung_log.note(Tag.GATE_FIRST_MEASUREMENT, f"inconsistent, measured again: {consistency.detail}")
        rung_log.log_rounds(rounds, cfg.gate.objective, "gate/first_interleaved_rounds.csv", "gate/first_round_ratio")
        rounds = _rounds(champion, cand, sweep, gate, name, apart, c, 2)
        consistency = gate.consistency(rounds, recorded["champion"], recorded["challenger"])
        consistency = again.said(consistency) if again else consistency
    rung_log.log_rounds(rounds, cfg.gate.objective, "gate/interleaved_rounds.csv", "gate/round_ratio")
    rung_log.note(Tag.GATE_INTERLEAVED,
                  contender.ROUNDS_DONE[bool(rounds_cfg.get("fresh_build_per_run", False))])
    on_rounds = [gate.interleaved(rounds), *([memory_saving.on_rounds(rounds, gate)] if aim == "memory" else [])]
    if not consistency.passed:
        tried = " and ".join([*([f"the {again.side}'s own run"] if again else []), "the rounds"]) + " measured again"
        consistency, on_rounds = consistent.undecided(consistency, tried, on_rounds)
    return Judged([*on_rounds, consistency, *slos(rounds)], recorded["champion"], recorded["challenger"])


def _recorded_again(cand: Candidate, sweep: Sweep, name: str, apart: contender.Apart, c: int, side: str):
    """`side`'s recorded run at c measured again as its load ladder measured it (the same load settings and
    requests), on a fresh build in a fresh process."""
    cfg = sweep.cfg
    block = LADDER + [int(x) for x in cfg.benchmark.concurrency].index(c)   # the level's place in the ladder
    build = functools.partial(build_engine, cand, int(cfg.threads), Path(cfg.cache_dir) / "artefacts")
    with sweep.ui.stage(f"{name}: the rounds disagree with the {side}'s own run: that run measured again at c={c}, "
                        f"in a process of its own"):
        return contender.in_own_process(build, apart, sweep.workload, cfg.benchmark, c, float(cfg.gate.confidence),
                                        f"recorded-again-{side}", block)


def _slos(champion: BenchmarkReport, challenger: BenchmarkReport, cfg_gate, rounds) -> list[Criterion]:
    if not cfg_gate.get("slos_still_met", True):
        return []
    return [slo_verdict.criterion(champion, challenger, float(cfg_gate.confidence), rounds)]


def _decided(gate: Gate, champion: BenchmarkReport):
    """When to stop adding rounds: the gate's looks on speed (aiming at memory, on speed and memory together),
    and no SLO at the rounds' level that more rounds could still decide."""
    speed = gate.rounds_decided if gate.aim != "memory" else functools.partial(memory_saving.decided, gate)
    if not gate.cfg.get("slos_still_met", True):
        return speed
    return lambda rounds: speed(rounds) and not slo_verdict.undecided_in_rounds(
        champion, float(gate.cfg.confidence), rounds)


def _rounds(champion: RungOutcome, cand: Candidate, sweep: Sweep, gate: Gate, name: str, apart: contender.Apart,
            c: int, attempt: int) -> interleaved.Rounds:
    cfg = sweep.cfg
    why = "" if attempt == 1 else " (again: the first was inconsistent)"
    rounds_cfg = cfg.gate.interleaved
    threads, artefacts = int(cfg.threads), Path(cfg.cache_dir) / "artefacts"
    load = interleaved.load_config(cfg.benchmark, rounds_cfg, c)
    looks = gate.round_looks()
    most = looks[-1]
    upto = f"{looks[0]} to {most} rounds, more while undecided," if len(looks) > 1 else f"{most} rounds"
    with sweep.ui.stage(f"{name}: champion and challenger in {upto} at c={c}{why}") as st:
        # planned: both sides' runs of `seconds` each; the rate seen (warm-up and drain included) takes over
        planned = 2 * float(rounds_cfg.seconds) * most

        def on_round(r):
            st.progress(r, most, "rounds", planned_s=planned)

        builds = {who: functools.partial(build_engine, side, threads, artefacts)
                  for who, side in (("champion", champion.candidate), ("challenger", cand))}
        with contender.round_runs(builds, bool(rounds_cfg.get("fresh_build_per_run", False)),
                                  sweep.workload, load, c, cfg.gate.confidence, apart, attempt,
                                  on_build=lambda k, n: st.progress(k, n, "builds, each in a process of its own")
                                  ) as runs:
            # the order's seed: the sweep's, the rung and the attempt (a second measurement draws anew)
            seed = (int(cfg.seed), zlib.crc32(name.encode()), attempt)
            return interleaved.measure(runs, most, c, on_round, seed, looks[:-1], _decided(gate, champion.bench),
                                       rounds_cfg.get("budget_s"))
