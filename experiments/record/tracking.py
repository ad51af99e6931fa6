"""MLflow: one parent run per sweep, one child run per rung; sqlite + a local artefact root by default."""
from __future__ import annotations

import fcntl
import json
import os
import platform
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import mlflow
import psutil
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from experiments.core.errors import ConfigError, SweepInterrupted
from experiments.core.names import Tag
from experiments.core.secrets import scrub_params, scrub_text, scrub_tree

MAX_PARAM_CHARS = 500
PROBE_TIMEOUT_S = 5.0
# MLflow's SQLAlchemy stores besides sqlite (a dialect may name its driver: postgresql+psycopg://...)
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")
# Driver arguments that bound one connection attempt; the probe's thread deadline bounds any other driver.
CONNECT_TIMEOUT_ARGS = {"postgresql": {"connect_timeout": int(PROBE_TIMEOUT_S)},
                        "mysql": {"connect_timeout": int(PROBE_TIMEOUT_S)}}


def latest_sweep_experiment(cfg) -> str | None:
    """The experiment of the store's latest finished sweep, whatever its target (None: no sweep there yet; a
    sqlite store that does not exist is not created)."""
    uri = str(cfg.uri)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return None
    client = MlflowClient(tracking_uri=uri)
    ours = {e.experiment_id: e.name for e in client.search_experiments(filter_string="name LIKE 'roi-ladder/%'")}
    run = latest_sweep(client, list(ours))
    return ours[run.info.experiment_id] if run else None


def latest_sweep(client: MlflowClient, experiment_ids: list[str]):
    """The latest finished sweep's run in these experiments, or None."""
    runs = client.search_runs(experiment_ids, f"tags.`{Tag.KIND}` = 'sweep' and attributes.status = 'FINISHED'",
                              max_results=1, order_by=["attributes.start_time DESC"]) if experiment_ids else []
    return runs[0] if runs else None


def connect(cfg) -> str:
    """Point MLflow at the configured store and return the experiment id; a store that cannot be used is a
    ConfigError. Safe for jobs that reach one store at once (Hydra's joblib, submitit or ray launchers): MLflow
    creates a fresh sqlite store's tables unguarded on first use, so they are created here under an exclusive
    lock on a file beside the database, and of two jobs creating one experiment the loser takes the winner's.
    The experiment gets an explicit artefact location under tracking.artifact_root (or artefacts would land in
    the CWD); without one (tracking=server) the server's, and artefacts go through the server."""
    uri, shown = str(cfg.uri), scrub_text(str(cfg.uri))
    probe(cfg)
    try:
        if uri.startswith("sqlite:///"):
            db = Path(uri.removeprefix("sqlite:///"))
            with open(db.with_name(db.name + ".init-lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                MlflowClient(tracking_uri=uri).search_experiments(max_results=1)   # creates and migrates tables
        mlflow.set_tracking_uri(uri)
        client = MlflowClient()
        exp = client.get_experiment_by_name(cfg.experiment)
        if exp is not None:
            return exp.experiment_id
        location = None
        if cfg.get("artifact_root"):
            root = Path(cfg.artifact_root)
            root.mkdir(parents=True, exist_ok=True)
            location = (root / slug(cfg.experiment)).as_uri()
        try:
            return client.create_experiment(cfg.experiment, artifact_location=location)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return client.get_experiment_by_name(cfg.experiment).experiment_id   # another job created it first
    except (MlflowException, OSError) as exc:
        reason = scrub_text(" ".join(str(exc).split()))[:300]
        raise ConfigError(f"the MLflow store tracking.uri={shown} cannot be used ({reason})",
                          "set tracking.uri to sqlite:///<file>, a file: folder or a running http(s) MLflow server "
                          "(tracking=local is the default store under data_dir)") from None


def probe(cfg) -> None:
    """The store's checks that create nothing (a server or database that answers, an sqlite file that could be
    written): a sweep runs them before building its model, and creates the experiment only once the target's own
    data has been read."""
    uri = str(cfg.uri)
    if not str(cfg.experiment or "").strip():
        raise ConfigError("tracking.experiment is empty",
                          "name the MLflow experiment, e.g. tracking.experiment=roi-ladder")
    if uri.startswith(("http://", "https://")):
        _probe_server(uri, str(cfg.experiment))
    elif uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES:
        _probe_database(uri)
    elif uri.startswith("sqlite:///"):
        _probe_sqlite(Path(uri.removeprefix("sqlite:///")), scrub_text(uri))


def _probe_server(uri: str, experiment: str) -> None:
    """A server that is down or failing is told in PROBE_TIMEOUT_S: MLflow's own client retries for minutes."""
    shown = scrub_text(uri)
    url = f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/get-by-name?" + urllib.parse.urlencode(
        {"experiment_name": experiment})
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S):
            return
    except urllib.error.HTTPError as exc:
        if exc.code < 500:   # 404: no such experiment yet; 401/403: MLflow's client sends the credentials
            return
        raise ConfigError(f"the MLflow server at {shown} answers HTTP {exc.code} ({exc.reason})",
                          "check the server's log and its backend store, or record locally with tracking=local") \
            from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLError):   # MLflow's client may trust a certificate urllib does not
            return
        raise ConfigError(f"the MLflow server at {shown} is unreachable ({reason or type(exc).__name__})",
                          "start it (e.g. mlflow server --host 127.0.0.1 --port 5000) and check tracking.uri, or "
                          "record locally with tracking=local") from None


def _probe_database(uri: str) -> None:
    """A database that is down, refuses the login or lacks its driver is told in PROBE_TIMEOUT_S: MLflow
    retries a failed connection for about two minutes before it gives up with a traceback."""
    import sqlalchemy  # heavy
    from sqlalchemy.pool import NullPool  # heavy

    shown, scheme = scrub_text(uri), uri.split(":", 1)[0].split("+", 1)[0]
    failure: list[BaseException] = []

    def attempt() -> None:
        try:
            engine = sqlalchemy.create_engine(uri, poolclass=NullPool,
                                              connect_args=CONNECT_TIMEOUT_ARGS.get(scheme, {}))
            with engine.connect():
                pass
            engine.dispose()
        except Exception as exc:  # noqa: BLE001 - every failure is reported below, scrubbed
            failure.append(exc)

    probe = threading.Thread(target=attempt, daemon=True)   # daemon: a driver stuck past the deadline is left
    probe.start()
    probe.join(PROBE_TIMEOUT_S + 1)
    if probe.is_alive():
        raise ConfigError(f"the MLflow database at {shown} did not answer in {PROBE_TIMEOUT_S + 1:.0f} s",
                          "start it and check host and port in tracking.uri, or record locally with tracking=local")
    if failure:
        exc = failure[0]
        if isinstance(exc, (ImportError, sqlalchemy.exc.NoSuchModuleError)):
            raise ConfigError(f"tracking.uri={shown} needs a database driver that is not installed "
                              f"({scrub_text(str(exc))})",
                              f"install the {scheme} driver SQLAlchemy names, or record locally with tracking=local")
        reason = scrub_text(" ".join(str(getattr(exc, "orig", None) or exc).split()))[:300]
        raise ConfigError(f"the MLflow database at {shown} is unreachable ({reason})",
                          "start it and check host, port, user and password in tracking.uri, or record locally "
                          "with tracking=local")


def _probe_sqlite(db: Path, shown: str) -> None:
    """An sqlite file MLflow could not write fails now, not at the first logged metric."""
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=db.parent, prefix=".write-probe-"):   # unique: parallel sweeps
            pass
        if db.exists() and not os.access(db, os.W_OK):
            raise PermissionError(13, "the database file is read-only")
    except OSError as exc:
        raise ConfigError(f"the sqlite store tracking.uri={shown} is not writable ({exc.strerror or exc})",
                          "point tracking.uri at sqlite:///<a writable file>, or set data_dir to a writable folder "
                          "for tracking=local") from None


def slug(name: str) -> str:
    """A name safe in a file or folder name."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


def flatten(d, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in (d.items() if isinstance(d, dict) else enumerate(d)):
        key = f"{prefix}{k}"
        if isinstance(v, (dict, list)) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:MAX_PARAM_CHARS]
    return out


def log_params(params: dict[str, str]) -> None:
    items = list(scrub_params(params).items())
    for i in range(0, len(items), 100):
        mlflow.log_params(dict(items[i:i + 100]))


def log_series(series: dict[str, list[tuple[int, float]]], prefix: str = "", run_id: str | None = None) -> None:
    """On the active run, or on `run_id`."""
    now = int(time.time() * 1000)
    metrics = [Metric(f"{prefix}{name}", value, now, step) for name, pts in series.items() for step, value in pts]
    run_id = run_id or mlflow.active_run().info.run_id
    for i in range(0, len(metrics), 1000):
        MlflowClient().log_batch(run_id, metrics=metrics[i:i + 1000])


@contextmanager
def run(name: str, experiment_id: str, nested: bool = False, tags: dict | None = None, run_id: str | None = None):
    """A new run, or (run_id) an earlier one resumed; KILLED, not FAILED, when the user stopped the sweep."""
    with mlflow.start_run(run_id=run_id, run_name=None if run_id else name, experiment_id=experiment_id,
                          nested=nested, tags={k: scrub_text(v) for k, v in (tags or {}).items()}) as r:
        try:
            yield r
        except (KeyboardInterrupt, SweepInterrupted):
            mlflow.end_run("KILLED")
            raise


def run_status(run_id: str) -> str | None:
    """RUNNING, FINISHED, KILLED, ... or None when the store has no such (undeleted) run."""
    try:
        found = MlflowClient().get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return None
    return found.info.status if found.info.lifecycle_stage == "active" else None


def mark_run(run_id: str, tags: dict, status: str | None = None, metrics: dict | None = None) -> None:
    """Tags, metrics and a final status on a run that is not the active one (a rung that has ended, or one an
    earlier sweep left behind)."""
    client = MlflowClient()
    for key, value in tags.items():
        client.set_tag(run_id, key, scrub_text(value))
    for key, value in (metrics or {}).items():
        client.log_metric(run_id, key, float(value))
    if status:
        client.set_terminated(run_id, status)


def set_tag(key: str, value) -> None:
    mlflow.set_tag(key, scrub_text(value))


def set_tags(tags: dict) -> None:
    mlflow.set_tags({k: scrub_text(v) for k, v in tags.items()})


def log_text(text: str, artifact_path: str) -> None:
    mlflow.log_text(scrub_text(text), artifact_path)


def log_file(path, artifact_dir: str) -> None:
    mlflow.log_artifact(str(path), artifact_dir)


def log_metric(key: str, value: float, step: int | None = None) -> None:
    mlflow.log_metric(key, value, step=step)


def log_metrics(metrics: dict[str, float]) -> None:
    mlflow.log_metrics(metrics)


def log_figure(figure, artifact_path: str) -> None:
    mlflow.log_figure(figure, artifact_path)


def client() -> MlflowClient:
    return MlflowClient()


def attach(uri: str, run_id: str):
    """The run an earlier process started, made this (child) process's active run: its status stays its
    starter's to set. Use as a context manager to end it on leaving, or call to leave it open."""
    mlflow.set_tracking_uri(uri)
    return mlflow.start_run(run_id=run_id)


def environment() -> dict:
    versions = {}
    for pkg in ("torch", "transformers", "onnxruntime", "onnxruntime_genai", "lm_eval", "mlflow", "hydra",
                "numpy", "scipy"):
        try:
            versions[pkg] = __import__(pkg).__version__
        except Exception:  # a missing optional package is simply not listed
            continue
    import torch  # heavy

    gpu = None
    if torch.cuda.is_available():
        gpu = {"name": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
               "cuda": torch.version.cuda}
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpu": _cpu_model(), "cores_logical": psutil.cpu_count(), "cores_physical": psutil.cpu_count(False),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "gpu": gpu, "versions": versions,
            "git_commit": git_commit()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_json(obj, artifact_path: str) -> None:
    mlflow.log_text(scrub_text(json.dumps(scrub_tree(obj), indent=2, default=str)), artifact_path)


def log_config(cfg, path: str = "config/resolved.yaml", params: bool = True) -> None:
    """The resolved config as params (flattened) and as a YAML artefact, secrets masked in both."""
    resolved = scrub_tree(OmegaConf.to_container(cfg, resolve=True))
    if params:
        log_params(flatten(resolved))
    log_text(OmegaConf.to_yaml(OmegaConf.create(resolved)), path)
