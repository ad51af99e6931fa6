"""`make server-check`: a quick sweep into `mlflow server` backed by a real PostgreSQL, checked run by run.

On loopback only and in scratch folders: Debian's PostgreSQL (installed with apt-get when missing and this is
root) gets a fresh cluster (initdb, a random password) on a free port, run as an unprivileged user when this
is root (PostgreSQL refuses root); `mlflow server` uses it as its backend store and keeps artefacts itself
(--artifacts-destination, served to clients as mlflow-artifacts:/). The sweep runs with tracking=server; the
check reads the runs back through the tracking API (one parent, one child per rung, their verdicts, an
artefact uploaded through the server) and counts the rows PostgreSQL holds. Only the processes started here
are stopped, by their process group, and the scratch folders are removed (--keep keeps them).
"""
from __future__ import annotations

import argparse
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from mlflow.tracking import MlflowClient

from experiments.climb.overrides import compose
from experiments.core.names import Tag
from experiments.tools.ui_check import free_port, stop_group, wait_healthy

REPO = Path(__file__).resolve().parents[2]
VERDICTS = {"accepted", "rejected", "undecided", "skipped", "failed"}
DB_USER, DB_NAME = "roi", "mlflow"
PG_USERS = ("postgres", "roi-postgres")      # Debian's package creates the first; the second is made if need be
APT_LOG = Path("/tmp/roi-ladder-postgresql.log")


@dataclass
class ServerCheckResult:
    tracking_uri: str
    backend: str                              # the backend store URI, password masked
    experiment: str = ""
    parent: str = ""                          # run id of the sweep's parent run
    rungs: dict[str, str] = field(default_factory=dict)      # rung -> verdict
    expected_rungs: list[str] = field(default_factory=list)
    artefact: str = ""                        # where the parent's config/resolved.yaml was stored
    pg_rows: dict[str, int] = field(default_factory=dict)    # table -> rows, counted in PostgreSQL itself
    problems: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.parent) and not self.problems

    def to_text(self) -> str:
        rungs = "\n".join(f"  {name:<14} {verdict}" for name, verdict in self.rungs.items())
        times = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        rows = ", ".join(f"{t} {n}" for t, n in self.pg_rows.items())
        verdict = "OK: the sweep's runs are in PostgreSQL, read back through the server" if self.ok else \
            "FAILED: " + "; ".join(self.problems or ["no sweep run found"])
        return (f"server check: tracking {self.tracking_uri}, backend store {self.backend}\n"
                f"experiment {self.experiment}, parent run {self.parent or '(none)'}, rungs:\n{rungs}\n"
                f"artefact via the server: {self.artefact or '(none)'}\n"
                f"rows in PostgreSQL: {rows or '(not counted)'}\n{verdict}\n({times})")


# --- PostgreSQL -------------------------------------------------------------------------------------------
def pg_bindir() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian keeps it off PATH: /usr/lib/postgresql/N/bin)."""
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p, "initdb").exists()]
    if found:
        return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def ensure_postgres(log=print) -> Path:
    """PostgreSQL's bin folder, installing Debian's package first when it is missing and apt and root are here."""
    bindir = pg_bindir()
    if bindir is not None:
        return bindir
    if not shutil.which("apt-get") or os.geteuid() != 0:
        raise RuntimeError("PostgreSQL is not installed and cannot be installed here (needs apt-get and root): "
                           "apt-get install -y postgresql")
    log(f"installing Debian's postgresql (log: {APT_LOG})")
    with open(APT_LOG, "w") as out:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"]):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900).returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: see {APT_LOG}")
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError(f"postgresql installed but no initdb found under /usr/lib/postgresql (see {APT_LOG})")
    return bindir


def can_run_postgres() -> str | None:
    """None when this machine can run the check, else why not."""
    if pg_bindir() is not None:
        return None
    if not shutil.which("apt-get"):
        return "PostgreSQL is not installed and there is no apt-get to install it"
    if os.geteuid() != 0:
        return "PostgreSQL is not installed and this is not root (apt-get install -y postgresql)"
    return None


def _unprivileged_user() -> pwd.struct_passwd | None:
    """None when this is not root (PostgreSQL then runs as this user); else the user it runs as."""
    if os.geteuid() != 0:
        return None
    for name in PG_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USERS[1]],
                   check=True, capture_output=True, timeout=60)
    return pwd.getpwnam(PG_USERS[1])


class Postgres:
    """A scratch cluster in `folder` on 127.0.0.1:`port` (unix socket in the folder too), started by `start`
    and stopped by `stop` (SIGINT: PostgreSQL's fast shutdown, to the postmaster's process group)."""

    def __init__(self, bindir: Path, folder: Path, port: int):
        self.bindir, self.folder, self.port = bindir, folder, port
        self.password = secrets.token_hex(16)
        self.user = _unprivileged_user()
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"postgresql://{DB_USER}:{self.password}@127.0.0.1:{self.port}/{DB_NAME}"

    @property
    def shown_uri(self) -> str:
        return self.uri.replace(self.password, "***")

    def _as_owner(self) -> dict:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": [],
                "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.folder),
                        "LC_ALL": "C.UTF-8"}}

    def start(self, timeout_s: float = 60) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        pwfile = self.folder / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.user is not None:
            for path in (self.folder, pwfile):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        data = self.folder / "data"
        owner = self._as_owner()
        init = subprocess.run([str(self.bindir / "initdb"), "-D", str(data), "-U", DB_USER, "--pwfile", str(pwfile),
                               "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync"],
                              cwd=self.folder, capture_output=True, text=True, timeout=300, **owner)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}): {(init.stdout + init.stderr)[-1500:]}")
        pwfile.unlink()
        log = open(self.folder / "postgres.log", "w")
        if self.user is not None:
            os.chown(log.name, self.user.pw_uid, self.user.pw_gid)
        self.proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.folder),
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=50"],
            cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **owner)
        self._wait_ready(timeout_s)
        self._create_database()

    def _connect(self, dbname: str, autocommit: bool = False):
        return psycopg.connect(host="127.0.0.1", port=self.port, user=DB_USER, password=self.password,
                               dbname=dbname, connect_timeout=3, autocommit=autocommit)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}: "
                                   f"{(self.folder / 'postgres.log').read_text()[-1500:]}")
            try:
                self._connect("postgres").close()
                return
            except psycopg.OperationalError:
                time.sleep(0.3)
        raise RuntimeError(f"postgres did not accept connections within {timeout_s:.0f} s")

    def _create_database(self) -> None:
        with self._connect("postgres", autocommit=True) as conn:   # CREATE DATABASE: not in a transaction
            conn.execute(f"CREATE DATABASE {DB_NAME}")

    def count_rows(self, tables=("experiments", "runs", "tags", "params", "metrics")) -> dict[str, int]:
        conn = self._connect(DB_NAME)
        try:
            with conn.cursor() as cur:
                counts = {}
                for table in tables:
                    cur.execute(f"SELECT count(*) FROM {table}")   # names from the tuple above, not from input
                    counts[table] = cur.fetchone()[0]
                return counts
        finally:
            conn.close()

    def version(self) -> str:
        conn = self._connect(DB_NAME)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW server_version")
                return cur.fetchone()[0]
        finally:
            conn.close()

    def stop(self, grace_s: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGINT)   # fast shutdown: disconnects clients, checkpoints, exits
            self.proc.wait(timeout=grace_s)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            stop_group(self.proc)


# --- mlflow server ----------------------------------------------------------------------------------------
def start_mlflow_server(backend_uri: str, artifacts: Path, port: int, log_path: Path) -> subprocess.Popen:
    """`mlflow server` on 127.0.0.1 in its own process group, artefacts kept and served by itself, MLflow's
    security middleware stated: Host headers it answers and browser origins it allows, this address only."""
    artifacts.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    hosts = f"127.0.0.1:{port},localhost:{port}"
    origins = f"http://127.0.0.1:{port},http://localhost:{port}"
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
           "--serve-artifacts", "--artifacts-destination", artifacts.as_uri(),
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--allowed-hosts", hosts, "--cors-allowed-origins", origins]
    log = open(log_path, "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_sweep(uri: str, data_dir: Path, ladder: str, cache_dir: Path | None, extra: list[str]) -> str:
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", "tracking=server", f"tracking.uri={uri}",
           "profile=quick", f"ladder={ladder}", f"data_dir={data_dir}"] + \
        ([f"cache_dir={cache_dir}"] if cache_dir else []) + list(extra)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"the sweep failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout


def check_runs(uri: str, experiment: str, expected_rungs: list[str], artifacts: Path,
               result: ServerCheckResult) -> None:
    """One parent run, one child per rung with a verdict, none failed; an artefact uploaded through the server."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        result.problems.append(f"no experiment {experiment!r} on the server")
        return
    result.experiment = f"{experiment} (id {exp.experiment_id}, artefacts {exp.artifact_location})"
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get(Tag.KIND) == "sweep"]
    if len(parents) != 1:
        result.problems.append(f"{len(parents)} sweep runs, expected 1")
        return
    parent = parents[0]
    result.parent = parent.info.run_id
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    result.rungs = {r.data.tags.get(Tag.RUNG, r.info.run_name): r.data.tags.get(Tag.VERDICT, "") for r in
                    sorted(children, key=lambda r: r.info.start_time)}
    names = sorted(r.data.tags.get(Tag.RUNG, "") for r in children)
    if names != sorted(expected_rungs):
        result.problems.append(f"child runs {names}, expected one per rung {sorted(expected_rungs)}")
    if stray := [r.info.run_id for r in runs if r not in parents and r not in children]:
        result.problems.append(f"runs outside the sweep: {stray}")
    for rung, verdict in result.rungs.items():
        if verdict not in VERDICTS - {"failed"}:
            result.problems.append(f"rung {rung}: verdict {verdict!r}")
    if parent.info.status != "FINISHED":
        result.problems.append(f"parent run status {parent.info.status}")
    if not parent.info.artifact_uri.startswith("mlflow-artifacts:"):
        result.problems.append(f"artefacts bypass the server: {parent.info.artifact_uri}")
    listed = {a.path for a in client.list_artifacts(parent.info.run_id, "config")}
    stored = list(artifacts.rglob(f"{parent.info.run_id}/artifacts/config/resolved.yaml"))
    if "config/resolved.yaml" not in listed or not stored:
        result.problems.append(f"config/resolved.yaml not stored through the server (listed: {sorted(listed)})")
    else:
        result.artefact = f"{parent.info.artifact_uri}/config/resolved.yaml -> {stored[0]}"


def run_check(work: Path, ladder: str = "engine-swap", cache_dir: Path | None = None, target: str = "tiny-llm",
              extra: list[str] = (), log=print) -> ServerCheckResult:
    """PostgreSQL, mlflow server, sweep, check; both servers are stopped in any case."""
    t0 = time.perf_counter()
    bindir = ensure_postgres(log)
    pg = Postgres(bindir, work / "pg", free_port())
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    result = ServerCheckResult(uri, pg.shown_uri)
    server = None
    try:
        pg.start()
        result.seconds["postgres up"] = time.perf_counter() - t0
        log(f"PostgreSQL {pg.version()} on 127.0.0.1:{pg.port} (pid {pg.proc.pid}"
            f"{', user ' + pg.user.pw_name if pg.user else ''}), database {DB_NAME}")
        t = time.perf_counter()
        server = start_mlflow_server(pg.uri, work / "artifacts", port, work / "mlflow-server.log")
        wait_healthy(port, server)
        result.seconds["mlflow server up"] = time.perf_counter() - t
        log(f"mlflow server on {uri} (process group {server.pid}), backend {pg.shown_uri}; running a quick sweep")
        cfg = compose([f"target={target}", f"ladder={ladder}", "tracking=server", f"tracking.uri={uri}",
                       f"data_dir={work / 'data'}"])
        expected = list(cfg.ladder.get("rungs") or {})
        t = time.perf_counter()
        out = run_sweep(uri, work / "data", ladder, cache_dir, [f"target={target}", *extra])
        (work / "sweep.log").write_text(out)
        result.seconds["sweep"] = time.perf_counter() - t
        result.expected_rungs = expected
        check_runs(uri, str(cfg.tracking.experiment), expected, work / "artifacts", result)
        result.pg_rows = pg.count_rows()
        if result.pg_rows.get("runs", 0) != 1 + len(expected):
            result.problems.append(f"PostgreSQL holds {result.pg_rows.get('runs')} runs, expected {1 + len(expected)}")
        return result
    finally:
        t = time.perf_counter()
        if server is not None:
            stop_group(server)
        pg.stop()
        result.seconds["teardown"] = time.perf_counter() - t
        result.seconds["total"] = time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ladder", default="engine-swap", help="the ladder of the quick sweep (default: engine-swap)")
    ap.add_argument("--target", default="tiny-llm", help="the target swept (default: tiny-llm)")
    ap.add_argument("--cache-dir", default=str(REPO / ".roi" / "cache"), help="built models (reused, not rebuilt)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch cluster, artefacts and logs, print where")
    args, extra = ap.parse_known_args(argv)
    work = Path(tempfile.mkdtemp(prefix="roi-server-check-"))
    os.chmod(work, 0o755)                 # PostgreSQL's user (not root) must reach its folder inside
    try:
        result = run_check(work, args.ladder, Path(args.cache_dir), args.target, extra)
        print(result.to_text())
        return 0 if result.ok else 1
    except RuntimeError as exc:
        print(f"server-check: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"kept: {work} (pg/postgres.log, mlflow-server.log, sweep.log, artifacts/)")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
