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
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient
from rich.console import Console
from rich.table import Table

from experiments.benchmarks.gate_quality import Rate

VERDICTS = ("accepted", "rejected", "undecided", "skipped", "failed")
GATE, NOT_CRITERIA = "roi.gate.", {"roi.gate.first_measurement", "roi.gate.interleaved", "roi.gate.recorded_again"}


@dataclass
class Sweep:
    """One sweep's outcome, read back from its MLflow store."""
    seconds: float
    champion: str
    verdicts: dict[str, str] = field(default_factory=dict)       # rung -> verdict
    deciding: dict[str, str] = field(default_factory=dict)       # rung -> what decided it, in a few words


def run_sweep(data: Path, cache: Path, overrides: list[str]) -> Sweep:
    shutil.rmtree(data, ignore_errors=True)         # a fresh store: an earlier sweep's ledger would be resumed
    data.mkdir(parents=True)
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", f"data_dir={data}", f"cache_dir={cache}", *overrides]
    started = time.monotonic()
    with open(data / "sweep.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    sweep = read_sweep(data, seconds)
    if proc.returncode != 0:                        # counted as what it is, and the next sweep runs
        sweep.champion = f"none (the sweep exited with {proc.returncode}: {data / 'sweep.log'})"
    return sweep


def read_sweep(data: Path, seconds: float) -> Sweep:
    client = MlflowClient(tracking_uri=f"sqlite:///{data}/mlflow.db")
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = sorted(client.search_runs(ids, max_results=1000) if ids else [], key=lambda r: r.info.start_time)
    parent = next((r for r in runs if r.data.tags.get("roi.kind") == "sweep"), None)
    out = Sweep(seconds, parent.data.tags.get("roi.champion_rung", "none") if parent else "none")
    for r in runs:
        tags = r.data.tags
        if tags.get("roi.kind") == "rung":
            out.verdicts[tags["roi.rung"]] = tags["roi.verdict"]
            out.deciding[tags["roi.rung"]] = deciding(tags, r.data.metrics)
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
    if tags["roi.verdict"] not in ("rejected", "undecided") or not against:
        return speed or tags.get("roi.reason", "")[:100]
    said = [speed if name == "performance" and speed else f"{name}: {text[:100]}" for name, text in against.items()]
    return "; ".join(said if "performance" in against or not speed else [*said, speed])


def report(sweeps: list[Sweep], console: Console) -> str:
    """The tables, printed, and as markdown (returned) for docs/benchmarks.md."""
    k = len(sweeps)
    rungs = list(dict.fromkeys(r for s in sweeps for r in s.verdicts))
    table = Table("rung", *VERDICTS, "same every run", title=f"verdicts over {k} sweeps")
    md = [f"| rung | {' | '.join(VERDICTS)} | same every run |", "|---" * (len(VERDICTS) + 2) + "|"]
    boundary = []
    for rung in rungs:
        seen = collections.Counter(s.verdicts.get(rung, "absent") for s in sweeps)
        counts = [str(seen.get(v, 0)) for v in VERDICTS]
        same = "yes" if len(seen) == 1 else "NO"
        table.add_row(rung, *counts, same)
        md.append(f"| {rung} | {' | '.join(counts)} | {same} |")
        if len(seen) > 1:
            boundary.append(rung)
    console.print(table)
    champions = collections.Counter(s.champion for s in sweeps)
    top, hits = champions.most_common(1)[0]
    rate = Rate(hits, k)
    lo, hi = rate.interval()
    line = (f"champion: {top} in {hits} of {k} sweeps ({rate.share:.0%}, 95 % CI [{lo:.0%}, {hi:.0%}]); "
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
    times = ", ".join(f"{s.seconds / 60:.1f}" for s in sweeps)
    console.print(f"minutes per sweep: {times}")
    md += ["", f"Minutes per sweep: {times}."]
    return "\n".join(md) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="sweeps to run (K >= 5 for the issue's table)")
    parser.add_argument("--out", type=Path, default=Path(".roi/bench-ladder"),
                        help="a data folder per sweep under it (run-1, run-2, ...) and the report")
    parser.add_argument("--cache", type=Path, default=Path(".roi/cache"),
                        help="the model and artefact cache every sweep shares (the default sweep's)")
    parser.add_argument("--read", action="store_true", help="report on the sweeps already under --out, run none")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every sweep (profile=quick, ...)")
    args = parser.parse_intermixed_args()
    console, out = Console(width=200), args.out.resolve()
    sweeps = []
    for i in range(1, args.runs + 1):
        data = out / f"run-{i}"
        if args.read:
            sweeps.append(read_sweep(data, float("nan")))
            continue
        console.print(f"sweep {i} of {args.runs}: {' '.join(args.overrides) or 'the defaults'} into {data}")
        sweeps.append(run_sweep(data, args.cache.resolve(), args.overrides))
        console.print(f"  champion {sweeps[-1].champion} after {sweeps[-1].seconds / 60:.1f} min")
    (out / "report.md").write_text(report(sweeps, console))
    console.print(f"report: {out / 'report.md'}")


if __name__ == "__main__":
    main()
