"""`make ui-check`: does the MLflow UI, in a real browser, show a sweep's rungs and their verdicts?

Starts `mlflow server` on 127.0.0.1 (a free port, a fresh sqlite store, in its own process group), runs a quick
sweep into it, opens the shared view of the runs table that the sweep saved and printed — what the UI's Share
button stores: an experiment tag `mlflow.sharedViewState.sweep-<id>` with the filter, the columns `roi.rung` and
`roi.verdict`, and the runs grouped by `roi.kind` (grouping lists the child runs flat; a nested child stays
collapsed under its parent) — at `#/experiments/<id>/runs?viewStateShareKey=sweep-<id>` in headless Chromium, and reads the table's rows out of the
dumped DOM (ag-grid rows carry the run id, cells the column id). Then the pages a reviewer opens from the URLs
the sweep prints: the experiment on its runs view (not MLflow 3's GenAI dashboard), the sweep's run with its
description (the ladder table, the champion), and the sweep's `report.html`; each page is screenshotted, and the
screenshots are logged to the sweep's run under `ui-check/`. The server's process group is stopped after.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from mlflow.tracking import MlflowClient

from experiments.core.names import Tag
from experiments.record.ui import EXPERIMENT_KIND, experiment_url, ladder_view_url, run_url

REPO = Path(__file__).resolve().parents[2]
NAME_COL, VERDICT_COL = "attributes.`Run Name`", f"tags.`{Tag.VERDICT}`"
# A wide window: ag-grid renders only the columns in view, and the verdict column comes after the metrics.
CHROMIUM_FLAGS = ["--headless", "--window-size=1920,1600", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]


@dataclass(frozen=True)
class PageCheck:
    name: str
    url: str
    missing: tuple[str, ...]                 # texts the page should show and did not
    screenshot: Path | None = None

    def to_text(self) -> str:
        seen = "OK" if not self.missing else f"FAILED: missing {', '.join(repr(m) for m in self.missing)}"
        return f"  {self.name:<24} {seen}  ({self.url}; screenshot {self.screenshot})"


@dataclass(frozen=True)
class UiCheckResult:
    url: str
    expected: dict[str, str]                 # rung run name -> verdict, from the tracking API
    seen: dict[str, str]                     # run name -> verdict, as the browser's DOM shows them
    seconds: dict[str, float] = field(default_factory=dict)
    pages: tuple[PageCheck, ...] = ()
    experiment_kind: str = ""

    @property
    def missing(self) -> list[str]:
        return [f"{name} ({verdict})" for name, verdict in self.expected.items() if self.seen.get(name) != verdict]

    @property
    def ok(self) -> bool:
        return bool(self.expected) and not self.missing and self.experiment_kind == EXPERIMENT_KIND[1] and \
            bool(self.pages) and not any(p.missing for p in self.pages)

    def to_text(self) -> str:
        times = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        rows = "\n".join(f"  {name:<24} expected {verdict:<9} DOM: {self.seen.get(name, '(absent)')}"
                         for name, verdict in self.expected.items())
        verdict = "OK: every rung run and its verdict is in the runs table" if not self.missing else \
            f"FAILED: not shown as expected: {', '.join(self.missing) or 'no rung runs'}"
        pages = "\n".join(p.to_text() for p in self.pages)
        return (f"UI check of {self.url}\n{rows}\n{verdict}\nexperiment kind: {self.experiment_kind or '(unset)'}\n"
                f"pages:\n{pages}\n({times})")


def run_check(data_dir: Path, chromium: str, ladder: str = "engine-swap", cache_dir: Path | None = None,
              budget_ms: int = 20000, log=print, profile: str = "quick") -> UiCheckResult:
    """Server, sweep, shared view, browser, DOM; the server's whole process group is stopped in any case."""
    port, seconds = free_port(), {}
    started = time.perf_counter()
    server = start_server(data_dir, port)
    try:
        wait_healthy(port, server)
        seconds["server start"] = time.perf_counter() - started
        uri = f"http://127.0.0.1:{port}"
        log(f"mlflow server up on {uri} (process group {server.pid}); running a {profile} sweep into it")
        t = time.perf_counter()
        sweep(data_dir, uri, ladder, cache_dir, profile)
        seconds["sweep"] = time.perf_counter() - t
        experiment_id, expected, parent = rung_verdicts(uri)
        # the runs view the sweep saved and printed: its rungs flat, verdict column shown
        url = ladder_view_url(uri, experiment_id, f"sweep-{_client(uri).get_run(parent).data.tags[Tag.SWEEP]}")
        t = time.perf_counter()
        dom = dump_dom(chromium, url, data_dir / "chromium-profile", budget_ms)
        seconds["browser"] = time.perf_counter() - t
        (data_dir / "runs-table.html").write_text(dom)
        (data_dir / "screenshots").mkdir(exist_ok=True)
        screenshot(chromium, url, data_dir / "chromium-profile", budget_ms, data_dir / "screenshots" / "ladder.png")
        _client(uri).log_artifact(parent, str(data_dir / "screenshots" / "ladder.png"), "ui-check")
        t = time.perf_counter()
        pages = review_pages(uri, experiment_id, parent, set(expected), chromium, data_dir, budget_ms)
        seconds["review pages"] = time.perf_counter() - t
        kind = _client(uri).get_experiment(experiment_id).tags.get(EXPERIMENT_KIND[0], "")
        return UiCheckResult(url, expected, runs_table(dom), seconds, pages, kind)
    finally:
        stop_group(server)


# --- the steps --------------------------------------------------------------------------------------------
def start_server(data_dir: Path, port: int) -> subprocess.Popen:
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{data_dir}/mlflow.db",
           "--default-artifact-root", (data_dir / "mlartifacts").as_uri(), "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    log = open(data_dir / "mlflow-server.log", "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(port: int, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {server.returncode} (see mlflow-server.log)")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"mlflow server did not answer /health within {timeout_s:.0f} s")


def sweep(data_dir: Path, uri: str, ladder: str, cache_dir: Path | None, profile: str = "quick") -> None:
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", f"profile={profile}", f"ladder={ladder}",
           f"data_dir={data_dir}", f"tracking.uri={uri}"] + ([f"cache_dir={cache_dir}"] if cache_dir else [])
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"the sweep failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")


def rung_verdicts(uri: str) -> tuple[str, dict[str, str], str]:
    """(experiment id, rung run name -> roi.verdict, parent run id) of the latest sweep, from the API."""
    client = MlflowClient(tracking_uri=uri)
    parent = client.search_runs(_experiments(client), f"tags.`{Tag.KIND}` = 'sweep'",
                                order_by=["attributes.start_time DESC"], max_results=1)[0]
    kids = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return parent.info.experiment_id, {r.info.run_name: r.data.tags.get(Tag.VERDICT, "") for r in kids}, \
        parent.info.run_id


def _experiments(client) -> list[str]:
    return [e.experiment_id for e in client.search_experiments() if e.name.startswith("roi-ladder/")]


def review_pages(uri: str, experiment_id: str, parent: str, rungs: set[str], chromium: str, data_dir: Path,
                 budget_ms: int) -> tuple[PageCheck, ...]:
    """The pages the sweep's printed URLs open, each read from its DOM and screenshotted; the screenshots are
    logged to the sweep's run. The report is fetched the way the artefact viewer fetches it (the viewer shows it
    in a sandboxed frame that a DOM dump does not enter)."""
    client = _client(uri)
    run = client.get_run(parent)
    champion = run.data.tags.get(Tag.CHAMPION_RUNG, "")
    shots = data_dir / "screenshots"
    pages = []
    for name, url, texts in (
            ("experiment (runs view)", experiment_url(uri, experiment_id), [run.info.run_name]),
            ("sweep run description", run_url(uri, experiment_id, parent), [f"Champion: {champion}", *sorted(rungs)])):
        profile = data_dir / "chromium-profile"
        text = _visible_text(dump_dom(chromium, url, profile, budget_ms))
        shot = shots / f"{name.split(' ')[0]}.png"
        screenshot(chromium, url, profile, budget_ms, shot)
        pages.append(PageCheck(name, url, tuple(t for t in texts if t not in text), shot))
    report_url = f"{uri}/get-artifact?path=report.html&run_uuid={parent}"
    with urllib.request.urlopen(report_url, timeout=30) as resp:
        report = resp.read().decode()
    (data_dir / "report.html").write_text(report)
    shot = shots / "report.png"
    screenshot(chromium, (data_dir / "report.html").as_uri(), data_dir / "chromium-profile", budget_ms, shot)
    wanted = ["<table", "data:image/png;base64,", *(f"<td>{r}</td>" for r in sorted(rungs))]
    pages.append(PageCheck("report.html", report_url, tuple(w for w in wanted if w not in report), shot))
    for page in pages:
        client.log_artifact(parent, str(page.screenshot), "ui-check")
    return tuple(pages)


def _client(uri: str):
    return MlflowClient(tracking_uri=uri)


def _visible_text(dom: str) -> str:
    """The page's text with the markup gone and white space folded (a heading splits text across tags)."""
    parser = _Text()
    parser.feed(dom)
    return " ".join(" ".join(parser.parts).split())


def screenshot(chromium: str, url: str, profile: Path, budget_ms: int, out: Path, timeout_s: float = 120) -> None:
    shutil.rmtree(profile, ignore_errors=True)
    cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
           "--hide-scrollbars", f"--screenshot={out}", url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        stop_group(proc)
    if not out.exists() or not out.stat().st_size:
        raise RuntimeError(f"chromium wrote no screenshot of {url} (exit {proc.returncode}): {err[-1500:]}")


def dump_dom(chromium: str, url: str, profile: Path, budget_ms: int, timeout_s: float = 120) -> str:
    """Headless Chromium with a fresh profile, offline-safe flags, the DOM after `budget_ms` of virtual time."""
    shutil.rmtree(profile, ignore_errors=True)
    cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}",
           "--dump-dom", url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        stop_group(proc)
    if proc.returncode != 0 or not out.strip():
        raise RuntimeError(f"chromium exited with {proc.returncode} and {len(out)} bytes of DOM: {err[-1500:]}")
    return out


def stop_group(proc: subprocess.Popen, grace_s: float = 20) -> None:
    """SIGTERM to the process group this module started (its leader is `proc`), SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(proc.pid):
            break
        time.sleep(1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


# --- reading the table ------------------------------------------------------------------------------------
class _Rows(HTMLParser):
    """Cell texts per ag-grid row: row-id (which ends with the run id) -> col-id -> text."""
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self):
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self._stack: list[tuple[str, str | None, str | None]] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        a = dict(attrs)
        row = a.get("row-id") or (self._stack[-1][1] if self._stack else None)
        col = a.get("col-id") or (self._stack[-1][2] if self._stack else None)
        self._stack.append((tag, row, col))

    def handle_endtag(self, tag):
        while self._stack:
            if self._stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if self._stack and self._stack[-1][1] and self._stack[-1][2] and data.strip():
            _, row, col = self._stack[-1]
            cells = self.rows.setdefault(row, {})
            cells[col] = (cells.get(col, "") + " " + data.strip()).strip()


class _Text(HTMLParser):
    SKIP = {"script", "style"}

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag, attrs):
        self._skipping += tag in self.SKIP

    def handle_endtag(self, tag):
        self._skipping -= tag in self.SKIP and self._skipping > 0

    def handle_data(self, data):
        if not self._skipping:
            self.parts.append(data)


def runs_table(dom: str) -> dict[str, str]:
    """Run name -> the verdict cell of the same row, for every run row the table rendered."""
    parser = _Rows()
    parser.feed(dom)
    # A top-level run's name cell starts with its colour swatch's label ("#1f272d sweep-..."): not the name.
    name = lambda text: text.split(" ", 1)[1] if text.startswith("#") and " " in text else text  # noqa: E731
    return {name(cells[NAME_COL]): cells.get(VERDICT_COL, "") for cells in parser.rows.values() if NAME_COL in cells}


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ladder", default="engine-swap", help="the ladder of the quick sweep (default: engine-swap)")
    ap.add_argument("--cache-dir", default=str(REPO / ".roi" / "cache"), help="built models (reused, not rebuilt)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch store, DOM and logs, and print where")
    ap.add_argument("--budget-ms", type=int, default=20000, help="Chromium's virtual-time budget")
    args = ap.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print("ui-check: Chromium is not installed (Debian: apt-get install -y chromium)", file=sys.stderr)
        return 2
    data = Path(tempfile.mkdtemp(prefix="roi-ui-check-"))
    try:
        result = run_check(data, chromium, args.ladder, Path(args.cache_dir), args.budget_ms)
        print(result.to_text())
        return 0 if result.ok else 1
    finally:
        if args.keep:
            print(f"kept: {data} (runs-table.html, report.html, screenshots/, mlflow-server.log, mlflow.db)")
        else:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
