"""What the user sees: a live status line per stage, a line per finished rung, and the ladder table."""
from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

def quiet_libraries() -> None:
    """Library chatter (progress bars, per-request warnings) would bury what the user came for."""
    import logging
    import os

    import transformers

    os.environ.setdefault("TQDM_DISABLE", "1")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name in ("lm_eval", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)


VERDICT_STYLE = {"accepted": "green", "rejected": "red", "skipped": "yellow", "failed": "bold red"}


class SweepConsole:
    def __init__(self, console: Console | None = None):
        if console is None:
            console = Console()
            if not console.is_terminal:   # logs and CI: wide enough that the table stays readable
                console = Console(width=160)
        self.console = console

    def note(self, message: str) -> None:
        self.console.print(f"  [dim]{message}[/dim]")

    @contextmanager
    def stage(self, title: str):
        started = time.perf_counter()
        with self.console.status(title) as status:
            yield _Stage(status)
        self.console.print(f"  [dim]{title} ({time.perf_counter() - started:.1f} s)[/dim]")

    def rung_done(self, outcome, top: int) -> None:
        style = VERDICT_STYLE.get(outcome.verdict.status, "")
        self.console.print(f"[bold]{outcome.name}[/bold]: [{style}]{outcome.verdict.status}[/{style}] "
                           f"— {outcome.verdict.reason}")

    def summary(self, result, top: int, tracking_uri: str) -> None:
        table = Table(title="ROI ladder", show_lines=True)
        for col in ("rung", "verdict", "TTFT p50 ms (c=1)", "TPOT p50 ms (c=1)", f"tokens/s (c={top})",
                    "accuracy", "reason"):
            table.add_column(col, overflow="fold")
        for o in result.outcomes:
            s = o.summary(top)
            before = o.champion_before.summary(top) if o.champion_before else {}
            table.add_row(o.name, f"[{VERDICT_STYLE.get(o.verdict.status, '')}]{o.verdict.status}",
                          _cell(s, before, "ttft_ms_p50", "%.2f"), _cell(s, before, "tpot_ms_p50", "%.3f"),
                          _cell(s, before, "tokens_per_s", "%.0f"), _cell(s, before, "accuracy", "%.3f"),
                          o.verdict.reason)
        self.console.print(table)
        champ = result.champion
        self.console.print(f"Champion: [bold]{champ.name if champ else 'none'}[/bold] "
                           f"(run {champ.run_id if champ else '-'}) · sweep run {result.parent_run_id}")
        self.console.print(f"Next: `make ui` to compare the runs in MLflow ({tracking_uri}).")


class _Stage:
    def __init__(self, status):
        self._status = status

    def update(self, text: str) -> None:
        self._status.update(text)


def _cell(now: dict, before: dict, key: str, fmt: str) -> str:
    if key not in now:
        return "–"
    text = fmt % now[key]
    if key in before and before[key]:
        text += f" ({(now[key] / before[key] - 1) * 100:+.0f} %)"
    return text
