"""What a sweep produced: each rung's outcome (verdict, candidate, measurements) and the ladder as a table."""
from __future__ import annotations

from dataclasses import dataclass, field

from experiments.core.names import DEFAULT_KIND
from experiments.core.recipe import Candidate
from experiments.core.reports import BenchmarkReport
from experiments.judge.accuracy import AccuracyReport
from experiments.judge.fidelity import FidelityReport
from experiments.judge.gate import Verdict
from experiments.targets.kinds import kind_of


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
    decode_floor_ms: float | None = None   # the memory-bandwidth floor of one stream's decode step (roofline)
    champion_bench: BenchmarkReport | None = None   # the champion's recorded runs, one measured again by this gate

    def summary(self, top_concurrency: int) -> dict[str, float]:
        """The ladder table's numbers: each latency's P50 at the first level, the kind's throughput at the top."""
        if self.bench is None:
            return {}
        c1, top = self.bench.levels[0], self.bench.level(top_concurrency)
        out = {f"{m}_p50": st.p50.value for m, st in c1.stats.items() if st is not None}
        out["throughput"] = kind_of(self.bench.kind).throughput(top)
        if self.decode_floor_ms and "tpot_ms_p50" in out:
            out["tpot_over_floor"] = out["tpot_ms_p50"] / self.decode_floor_ms
        if self.accuracy:
            out["accuracy"] = self.accuracy[0].value
        return out


@dataclass
class SweepResult:
    parent_run_id: str
    experiment_id: str
    outcomes: list[RungOutcome]
    champion: RungOutcome | None
    urls: tuple[str, ...] = ()         # in the MLflow UI: the ladder's runs view, the sweep's run
    versus_defaults: str = ""          # the champion against the best engine default (climb/versus_defaults.py)


def table_columns(outcomes: list[RungOutcome], top: int) -> list[tuple[str, str, str]]:
    """(summary key, header, format) of the ladder table's measured columns, as the target's kind lays them
    out (TTFT and TPOT for a decoder, E2E and embeddings/s for an encoder)."""
    kind = next((o.bench.kind for o in outcomes if o.bench is not None), None) or \
        next((o.candidate.target.kind for o in outcomes if o.candidate is not None), DEFAULT_KIND)
    columns = kind_of(kind).columns(top)
    if any(o.decode_floor_ms for o in outcomes):
        # how far each engine's single-stream decode is from what the machine's memory bandwidth allows
        columns.insert(2, ("tpot_over_floor", "TPOT ÷ bandwidth floor", "×%.1f"))
    return columns


def markdown_table(outcomes: list[RungOutcome], top: int) -> str:
    """The ladder; each delta is against the champion the rung was gated against (named in `gated against`)."""
    columns = table_columns(outcomes, top)
    rows = ["| rung | verdict | gated against | " + " | ".join(h for _, h, _ in columns) + " | reason |",
            "|---|---|---|" + "---|" * len(columns) + "---|"]
    for o in outcomes:
        s = o.summary(top)
        before = before_summary(o, top)
        cells = " | ".join(cell(s, before, k, f) for k, _, f in columns)
        against = o.champion_before.name if o.champion_before else "–"
        rows.append(f"| {o.name} | {o.verdict.status} | {against} | {cells} | {o.verdict.reason} |")
    return "\n".join(rows) + "\n"


def before_summary(o: RungOutcome, top: int) -> dict[str, float]:
    """The numbers of the champion the rung was gated against, its accuracy over the documents the rung scored
    (the gate's pairs: a rung decided at the first look scored fewer than a champion completed since)."""
    if o.champion_before is None:
        return {}
    before = o.champion_before.summary(top)
    if "accuracy" in before and o.accuracy:
        mine, theirs = o.accuracy[0], o.champion_before.accuracy[0]
        if not theirs.missing(mine.ids):
            before["accuracy"] = float(theirs.at(mine.ids).mean())
    return before


def cell(now: dict, before: dict, key: str, fmt: str) -> str:
    """A value, and its change against the champion the rung was gated against."""
    if key not in now:
        return "–"
    text = fmt % now[key]
    if key in before and before[key]:
        text += f" ({(now[key] / before[key] - 1) * 100:+.0f} %)"
    return text
