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
from dataclasses import replace

from experiments.judge.gate import Criterion

SIDES = ("champion", "challenger")


def strayed(crit: Criterion) -> str:
    """The side whose rounds moved furthest (as a factor) from its own recorded run: the run to measure again."""
    return max(SIDES, key=lambda side: abs(math.log1p(crit.numbers[f"{side}_deviation"])))


def remeasured(first: Criterion, again: Criterion, side: str) -> Criterion:
    """`again` (the criterion judged with `side`'s recorded run measured again), saying what the new run showed."""
    was, rounds = first.numbers[f"{side}_recorded"], first.numbers[f"{side}_rounds"]
    now = again.numbers[f"{side}_recorded"]
    numbers = {**again.numbers, f"{side}_first_recorded": was, "remeasured_challenger": float(side == "challenger")}
    seen = f"the {side}'s own run, measured again in a fresh process, read {now:.1f} (first {was:.1f}, rounds {rounds:.1f})"
    if again.passed:
        return replace(again, detail=f"{again.detail}; {seen}: its first run was the disturbed one", numbers=numbers)
    return replace(again, detail=f"{again.detail}; {seen}", numbers=numbers)


def undecided(crit: Criterion, tried: str) -> Criterion:
    """The comparison still inconsistent after `tried`: undecided, which rejects nothing and accepts nothing."""
    why = crit.detail.removeprefix("measurement inconsistent: ")
    return replace(crit, detail=f"the measurement stayed inconsistent after {tried}: {why}",
                   undecided=True)
