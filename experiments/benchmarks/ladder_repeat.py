"""`make bench-ladder`: is the ladder's answer reproducible? The same sweep run K times, one after another.

Each run is `roi-ladder sweep` as a user runs it (the default ladder and profile unless told otherwise), in a data
folder of its own (its own MLflow store and ledger: nothing resumed, nothing shared but the cached model and
artefacts). Reported per rung: how often each verdict came out, and, where the runs disagree, what decided each
(the criterion that failed, or the speed ratio with its interval against the bound): the rung that sits at a
boundary, and why. And how often the sweep's champion was the same. Run alone: the sweeps measure, and another
process measuring beside them would be the noise this bench reads.
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient
from rich.console import Console
from rich.table import Table
from scipy import stats

from experiments.core.names import Tag

VERDICTS = ("accepted", "rejected", "undecided", "skipped", "failed")
HOME = Path(os.environ.get("ROI_LADDER_HOME", ".roi"))
GATE, NOT_CRITERIA = Tag.GATE, {Tag.GATE_FIRST_MEASUREMENT, Tag.GATE_INTERLEAVED, Tag.GATE_RECORDED_AGAIN}


@dataclass
class Sweep:
    """One sweep's outcome, read back from its MLflow store."""
    seconds: float
    champion: str
    verdicts: dict[str, str] = field(default_factory=dict)       # rung -> verdict
    deciding: dict[str, str] = field(default_factory=dict)       # rung -> what decided it, in a few words
    ratios: dict[str, tuple[float, float, float]] = field(default_factory=dict)   # rung -> speed ratio, its CI


def run_sweep(data: Path, cache: Path, overrides: list[str]) -> Sweep:
    """A sweep into `data`, a folder not used before (an earlier sweep's ledger there would be resumed), on the
    local store this bench reads back."""
    data.mkdir(parents=True)
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", f"data_dir={data}", f"cache_dir={cache}", *overrides,
           "tracking=local"]
    started = time.monotonic()
    with open(data / "sweep.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    (data / "seconds").write_text(f"{seconds:.1f}\n")
    sweep = read_sweep(data, seconds)
    if proc.returncode != 0:                        # counted as what it is, and the next sweep runs
        sweep.champion = f"none (the sweep exited with {proc.returncode}: {data / 'sweep.log'})"
    return sweep


def read_sweep(data: Path, seconds: float) -> Sweep:
    if not (data / "mlflow.db").exists():           # a sweep that stopped before its store was made
        return Sweep(seconds, "none")
    client = MlflowClient(tracking_uri=f"sqlite:///{data}/mlflow.db")
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = sorted(client.search_runs(ids, max_results=1000) if ids else [], key=lambda r: r.info.start_time)
    parent = next((r for r in runs if r.data.tags.get(Tag.KIND) == "sweep"), None)
    out = Sweep(seconds, parent.data.tags.get(Tag.CHAMPION_RUNG, "none") if parent else "none")
    for r in runs:
        tags = r.data.tags
        if tags.get(Tag.KIND) == "rung":
            rung = tags[Tag.RUNG]
            out.verdicts[rung] = tags.get(Tag.VERDICT, "no verdict")
            out.deciding[rung] = deciding(tags, r.data.metrics)
            if "gate/performance/ratio_ci_high" in r.data.metrics:
                out.ratios[rung] = tuple(r.data.metrics[f"gate/performance/{k}"]
                                                     for k in ("ratio", "ratio_ci_low", "ratio_ci_high"))
    return out


def deciding(tags: dict, metrics: dict) -> str:
    """What decided a rung: the criteria that did not pass (speed as its ratio and interval against the bound),
    and the speed ratio beside another criterion that failed; for an accepted rung, its speed ratio."""
    speed = ""
    if "gate/performance/ratio_ci_high" in metrics:
        speed = (f"speed ratio {metrics['gate/performance/ratio']:.3f} [{metrics['gate/performance/ratio_ci_low']:.3f}"
                 f", {metrics['gate/performance/ratio_ci_high']:.3f}] (< {metrics['gate/performance/ratio_needed']:.2f}"
                 f" needed)")
    against = {k[len(GATE):]: v.split(": ", 1)[-1] for k, v in sorted(tags.items())
               if k.startswith(GATE) and k not in NOT_CRITERIA and not v.startswith("pass")}
    if tags.get(Tag.VERDICT) not in ("rejected", "undecided") or not against:
        return speed or tags.get(Tag.REASON, "")[:100]
    said = [speed if name == "performance" and speed else f"{name}: {text[:100]}" for name, text in against.items()]
    return "; ".join(said if "performance" in against or not speed else [*said, speed])


def report(sweeps: list[Sweep], console: Console) -> str:
    """The tables, printed, and as markdown (returned) for docs/benchmarks.md."""
    k = len(sweeps)
    rungs = list(dict.fromkeys(r for s in sweeps for r in s.verdicts))
    seen_any = {v for s in sweeps for v in s.verdicts.values()}
    if any(r not in s.verdicts for s in sweeps for r in rungs):
        seen_any.add("absent")
    columns = [*VERDICTS, *sorted(seen_any - set(VERDICTS))]       # "no verdict", "absent": counted too
    table = Table("rung", *columns, "same every run", title=f"verdicts over {k} sweeps")
    md = [f"| rung | {' | '.join(columns)} | same every run |", "|---" * (len(columns) + 2) + "|"]
    boundary = []
    for rung in rungs:
        seen = collections.Counter(s.verdicts.get(rung, "absent") for s in sweeps)
        counts = [str(seen.get(v, 0)) for v in columns]
        same = "yes" if len(seen) == 1 else "NO"
        table.add_row(rung, *counts, same)
        md.append(f"| {rung} | {' | '.join(counts)} | {same} |")
        if len(seen) > 1:
            boundary.append(rung)
    console.print(table)
    champions = collections.Counter(s.champion for s in sweeps)
    top, hits = champions.most_common(1)[0]
    ci = stats.binomtest(hits, k).proportion_ci(0.95, method="exact")
    line = (f"champion: {top} in {hits} of {k} sweeps ({hits / k:.0%}, 95 % CI [{ci.low:.0%}, {ci.high:.0%}]); "
            + ", ".join(f"{c}: {n}" for c, n in champions.most_common()))
    console.print(line)
    md += ["", line, ""]
    for rung in boundary:
        console.print(f"[bold]{rung}[/] at a boundary:")
        md.append(f"**{rung}** at a boundary:")
        for i, s in enumerate(sweeps, 1):
            text = f"  sweep {i}: {s.verdicts.get(rung, 'absent')}, {s.deciding.get(rung, '')}"
            console.print(text, markup=False)
            md.append(f"- sweep {i}: {s.verdicts.get(rung, 'absent')}, {s.deciding.get(rung, '')}")
    margins = [(rung, [s.ratios[rung] for s in sweeps if rung in s.ratios]) for rung in rungs]
    margins = [(rung, seen) for rung, seen in margins if seen]
    if margins:      # how far from the bound each rung's speed was decided: the rungs that could flip
        md += ["", "| rung | speed ratio, each sweep | upper bounds, lowest to highest |", "|---|---|---|"]
        for rung, seen in margins:
            each = ", ".join(f"{r:.3f}" for r, _, _ in seen)
            highs = sorted(hi for _, _, hi in seen)
            md.append(f"| {rung} | {each} | {highs[0]:.3f} – {highs[-1]:.3f} |")
            console.print(f"{rung}: speed ratio {each}; upper bounds {highs[0]:.3f} – {highs[-1]:.3f}", markup=False)
    times = ", ".join(f"{s.seconds / 60:.1f}" for s in sweeps)
    console.print(f"minutes per sweep: {times}")
    md += ["", f"Minutes per sweep: {times}."]
    return "\n".join(md) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="sweeps to run (K >= 5 for the issue's table)")
    parser.add_argument("--out", type=Path, default=HOME / "bench-ladder",
                        help="where each run's folder of sweeps goes (a new one per run) and the report")
    parser.add_argument("--cache", type=Path, default=HOME / "cache",
                        help="the model and artefact cache every sweep shares (the default sweep's)")
    parser.add_argument("--read", type=Path, metavar="FOLDER",
                        help="report on the sweeps of an earlier run (a folder under --out), run none")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every sweep (profile=quick, ...)")
    args = parser.parse_intermixed_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    console = Console(width=200)
    if args.read:
        folders = sorted((p for p in args.read.iterdir() if p.is_dir() and p.name.split("-")[-1].isdigit()),
                         key=lambda p: int(p.name.split("-")[-1]))
        sweeps = [read_sweep(f, float((f / "seconds").read_text()) if (f / "seconds").exists() else float("nan"))
                  for f in folders]
        out = args.read
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        out = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=args.out)).resolve()
        sweeps = []
        for i in range(1, args.runs + 1):
            data = out / f"sweep-{i}"
            console.print(f"sweep {i} of {args.runs}: {' '.join(args.overrides) or 'the defaults'} into {data}")
            sweeps.append(run_sweep(data, args.cache.resolve(), args.overrides))
            console.print(f"  champion {sweeps[-1].champion} after {sweeps[-1].seconds / 60:.1f} min")
    (out / "report.md").write_text(report(sweeps, console))
    console.print(f"report: {out / 'report.md'}")


if __name__ == "__main__":
    main()
