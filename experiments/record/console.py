"""What the user sees: a live status line per stage, a line per finished rung, and the ladder table."""
from __future__ import annotations

import contextlib
import logging
import os
import time
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table
from rich.text import Text

from experiments.core import progress
from experiments.core.names import Metric
from experiments.core.stats import PERCENTILE_METHOD
from experiments.record.outcome import before_summary, cell, table_columns
from experiments.targets.kinds import kind_of

LOG_EVERY_S = 15.0


def quiet_libraries() -> None:
    """Library chatter (progress bars, per-request warnings) would bury what the user came for."""
    import transformers  # heavy

    os.environ.setdefault("TQDM_DISABLE", "1")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name in ("lm_eval", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)


VERDICT_STYLE = {"accepted": "green", "rejected": "red", "undecided": "magenta", "skipped": "yellow",
                 "failed": "bold red"}


class SweepConsole:
    def __init__(self, console: Console | None = None, relay: bool = False):
        if console is None:
            console = Console()
            if not console.is_terminal:   # logs and CI: wide enough that the table stays readable
                console = Console(width=160)
        self.console = console
        self.relay = relay and progress.relaying()

    def note(self, message: str) -> None:
        self.console.print(f"  [dim]{message}[/dim]")

    @contextmanager
    def stage(self, title: str):
        """A live line while the stage runs: its title, and where it counts work, done/total, time in and an
        estimate of what remains (experiments/core/progress.py), refreshed as the spinner turns. Off a terminal
        (logs, CI) a progress line is printed every LOG_EVERY_S instead. In a measuring child (relay=True) the
        same events go up to the process that shows them."""
        started = time.perf_counter()
        st = Stage(title, self.console, self.relay)
        if self.relay:
            progress.send(("stage", title), urgent=True)
        # rich's live display refreshes from a thread of its own, terminal or not: none in a measuring child (it
        # would run beside the measurement) nor where nobody sees it, and 4 a second (not 12.5) where one is shown,
        # in the rung's process that runs while its children measure
        live = (self.console.status(st, refresh_per_second=4) if self.console.is_terminal and not self.relay
                else contextlib.nullcontext())
        with live:
            yield st
        self.console.print(f"  [dim]{title} ({time.perf_counter() - started:.1f} s)[/dim]")

    def rung_start(self, position: int, rungs: int, name: str, measured_s: list[float], done: int) -> None:
        where = progress.sweep_text(position, rungs, measured_s, done)
        self.console.print(f"[bold]{name}[/bold] [dim]— {where}[/dim]")

    def levels(self, name: str, bench) -> None:
        self.console.print(level_table(bench, f"{name}: load ladder"))

    def rung_done(self, outcome, top: int) -> None:
        style = VERDICT_STYLE.get(outcome.verdict.status, "")
        self.console.print(f"[bold]{outcome.name}[/bold]: [{style}]{outcome.verdict.status}[/{style}] "
                           f"— {outcome.verdict.reason}")

    def summary(self, result, top: int, tracking_uri: str) -> None:
        table = Table(title="ROI ladder", show_lines=True)
        columns = table_columns(result.outcomes, top)
        for col in ("rung", "verdict", *(header for _, header, _ in columns), "reason"):
            table.add_column(col, overflow="fold")
        for o in result.outcomes:
            s = o.summary(top)
            before = before_summary(o, top)
            table.add_row(o.name, f"[{VERDICT_STYLE.get(o.verdict.status, '')}]{o.verdict.status}",
                          *(cell(s, before, key, fmt) for key, _, fmt in columns), o.verdict.reason)
        self.console.print(table)
        champ = result.champion
        self.console.print(f"Champion: [bold]{champ.name if champ else 'none'}[/bold] "
                           f"(run {champ.run_id if champ else '-'}) · sweep run {result.parent_run_id}")
        self.console.print(f"Next: `make ui` to compare the runs in MLflow ({tracking_uri}), then open")
        for url in result.urls:
            self.console.print(f"  {url}", soft_wrap=True)
        if getattr(result, "versus_defaults", ""):
            self.console.print(f"[bold]{result.versus_defaults}[/bold]", soft_wrap=True)


FLAG_TEXT = {"stable": "unstable", "p99_claimable": "no P99 claim", "error_rate_ok": "errors > 1 %",
             "min_requests_met": "too few requests"}


def level_table(bench, title: str = "load ladder") -> Table:
    """One row per measured level: counts, rates, latency percentiles, queue vs model share, validity."""
    table = Table(title=title, caption=f"percentiles: {PERCENTILE_METHOD}; '!' marks a P95 shown for want of "
                                       f"samples for a P99", caption_justify="left")

    kind = kind_of(bench.kind)
    for col in ("load (c or rate)", "n", "err %", "t/o %", "QPS", kind.throughput_unit, "E2E p50/p95/p99 ms", "TTFT p50/p95 ms",
                "TPOT p50 ms", "queue %", "CPU %", "flags"):
        table.add_column(col, justify="right" if col not in ("flags",) else "left")
    for lv in bench.levels:
        e2e, ttft, tpot = (lv.stats.get(m) for m in (Metric.E2E_MS, Metric.TTFT_MS, Metric.TPOT_MS))
        queue, model = lv.stats.get(Metric.QUEUE_MS), lv.stats.get(Metric.E2E_MS)
        share = f"{queue.mean / model.mean * 100:.0f}" if queue and model and model.mean else "–"
        flags = lv.validity()
        bad = [text for key, text in FLAG_TEXT.items() if flags.get(key) is False] + \
            (["saturated"] if flags.get("saturated") else [])
        load = f"{lv.offered_qps:g}/s" if lv.offered_qps else str(lv.concurrency)
        table.add_row(load, str(len(lv.records)), f"{lv.error_rate * 100:.1f}",
                      f"{lv.timeout_rate * 100:.1f}", f"{lv.qps:.1f}", f"{kind.throughput(lv):.0f}",
                      _percentiles(e2e, ("p50", "p95", "p99")), _percentiles(ttft, ("p50", "p95")),
                      f"{tpot.p50.value:.2f}" if tpot else "–", share, f"{lv.cpu_percent_mean:.0f}",
                      ", ".join(bad) or "ok")
    return table


def _percentiles(st, names) -> str:
    if st is None:
        return "–"
    out = []
    for n in names:
        v = st.stat(n)
        out.append(f"{st.p95.value:.1f}!" if v is None else f"{v:.1f}")
    return " / ".join(out)


class Stage:
    """What the live line shows; rendered anew at each refresh, so the estimate counts down between events."""

    def __init__(self, title: str, console: Console, relay: bool = False, clock=time.monotonic):
        self.title, self._console, self._relay, self._clock = title, console, relay, clock
        self.tracker = progress.Tracker(clock)
        self.child_title = ""             # the stage a measuring child is in, relayed
        self._printed = self._began = clock()

    def update(self, text: str) -> None:
        self.title = text

    def progress(self, done: float, total: float | None = None, what: str | None = None, unit: str | None = None,
                 planned_s: float | None = None) -> None:
        """done of total units of `what` (a new `what` starts a new count and clock)."""
        new = what is not None and what != self.tracker.what
        self.tracker.progress(done, total, what, unit, planned_s)
        if self._relay:
            progress.send(("progress", done, total, what, unit, planned_s),
                          urgent=new or (self.tracker.total is not None and done >= self.tracker.total))
        elif not self._console.is_terminal and self._clock() - self._printed >= LOG_EVERY_S:
            self._printed = self._clock()
            self._console.print(Text(f"  {self.describe(' — ')}", style="dim"), soft_wrap=True)

    def relayed(self, message) -> None:
        """A measuring child's event (isolation.run's on_progress)."""
        if message[0] == "stage":
            self.child_title, self.tracker = message[1], progress.Tracker(self._clock)
            self._began = self._clock()
        elif message[0] == "progress":
            self.progress(*message[1:])

    def describe(self, sep: str = "\n  ") -> str:
        # nothing counted (a build): the time it has taken so far, which a spinner alone does not say
        counted = self.tracker.text() or f"{self._clock() - self._began:.0f} s in"
        inner = " — ".join(t for t in (self.child_title, counted) if t)
        return f"{self.title}{sep}{inner}" if inner else self.title

    def __rich__(self) -> Text:
        try:
            return Text(self.describe())
        except Exception:   # read mid-update by the display's thread: the title alone this frame
            return Text(self.title)
