"""When the gate's rounds and the recorded runs disagree (Gate.consistency fails): which side strayed, what its
recorded run said when measured again, and what is said when nothing settles it.

Three measurements of each side exist by then: its recorded run, its runs in the rounds, and (here) its recorded
run measured again in a fresh process. A side whose rounds moved furthest from its own run is the one to measure
again: if the new run agrees with the rounds, its first run was the disturbed one (another process on the machine,
a slow start) and the comparison stands; if it agrees with its first run, the rounds are in doubt and are measured
again. A comparison still inconsistent after both is undecided: no evidence for the challenger, none against it,
so the champion stays and the verdict says so instead of calling the challenger worse."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from experiments.judge.gate import Criterion

SIDES = ("champion", "challenger")


def strayed(crit: Criterion) -> str:
    """The side whose rounds moved furthest (as a factor) from its own recorded run: the run to measure again (a
    side with no successful request in the rounds, its deviation NaN, first)."""
    def far(side: str) -> float:
        deviation = crit.numbers[f"{side}_deviation"]
        return math.inf if math.isnan(deviation) else abs(math.log1p(deviation))
    return max(SIDES, key=far)


@dataclass(frozen=True)
class Remeasured:
    """A side's recorded run measured again: its first figure and the rounds' it disagreed with."""
    side: str
    first: float
    rounds: float

    @classmethod
    def of(cls, crit: Criterion, side: str) -> "Remeasured":
        return cls(side, crit.numbers[f"{side}_recorded"], crit.numbers[f"{side}_rounds"])

    def said(self, crit: Criterion) -> Criterion:
        """`crit` (judged with the run measured again) saying what that run read against the first."""
        now = crit.numbers[f"{self.side}_recorded"]
        seen = (f"the {self.side}'s own run, measured again in a fresh process, read {now:.1f} (first "
                f"{self.first:.1f}, rounds {self.rounds:.1f})")
        if crit.passed:
            seen += ": its first run was the disturbed one"
        numbers = {**crit.numbers, f"{self.side}_first_recorded": self.first,
                   "remeasured_challenger": float(self.side == "challenger")}
        return replace(crit, detail=f"{crit.detail}; {seen}", numbers=numbers)


def undecided(crit: Criterion, tried: str, on_rounds: list[Criterion]) -> tuple[Criterion, list[Criterion]]:
    """The comparison still inconsistent after `tried`: undecided, and so is every criterion that failed on those
    rounds (they measured something else than the two configurations): nothing accepted, nothing called worse."""
    why = crit.detail.removeprefix("measurement inconsistent: ")
    crit = replace(crit, detail=f"the measurement stayed inconsistent after {tried}: {why}", undecided=True)
    return crit, [c if c.passed else replace(c, detail=f"{c.detail} (on rounds that disagree with the recorded "
                                                        f"runs)", undecided=True) for c in on_rounds]
