"""MLflow: one parent run per sweep, one child run per rung; sqlite + a local artefact root by default."""
from __future__ import annotations

import json
import os
import platform
import subprocess
from contextlib import contextmanager
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from experiments.secrets import scrub_params, scrub_text, scrub_tree

MAX_PARAM_CHARS = 500


def connect(cfg) -> str:
    """Point MLflow at the configured store and return the experiment id (created with an explicit
    artefact location, or artefacts would land in the CWD)."""
    uri = str(cfg.uri)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    exp = client.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        return exp.experiment_id
    root = Path(cfg.artifact_root)
    root.mkdir(parents=True, exist_ok=True)
    return client.create_experiment(cfg.experiment, artifact_location=(root / _slug(cfg.experiment)).as_uri())


def _slug(name: str) -> str:
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


def log_series(series: dict[str, list[tuple[int, float]]], prefix: str = "") -> None:
    from mlflow.entities import Metric
    import time

    now = int(time.time() * 1000)
    metrics = [Metric(f"{prefix}{name}", value, now, step) for name, pts in series.items() for step, value in pts]
    run = mlflow.active_run()
    for i in range(0, len(metrics), 1000):
        MlflowClient().log_batch(run.info.run_id, metrics=metrics[i:i + 1000])


@contextmanager
def run(name: str, experiment_id: str, nested: bool = False, tags: dict | None = None):
    with mlflow.start_run(run_name=name, experiment_id=experiment_id, nested=nested,
                          tags={k: scrub_text(v) for k, v in (tags or {}).items()}) as r:
        yield r


def set_tag(key: str, value) -> None:
    mlflow.set_tag(key, scrub_text(value))


def set_tags(tags: dict) -> None:
    mlflow.set_tags({k: scrub_text(v) for k, v in tags.items()})


def log_text(text: str, artifact_path: str) -> None:
    mlflow.log_text(scrub_text(text), artifact_path)


def environment() -> dict:
    import psutil

    versions = {}
    for pkg in ("torch", "transformers", "onnxruntime", "onnxruntime_genai", "lm_eval", "mlflow", "hydra",
                "numpy", "scipy"):
        try:
            versions[pkg] = __import__(pkg).__version__
        except Exception:  # a missing optional package is simply not listed
            continue
    import torch

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


def log_config(cfg) -> None:
    """The resolved config as params (flattened) and as `config/resolved.yaml`, secrets masked in both."""
    from omegaconf import OmegaConf

    resolved = scrub_tree(OmegaConf.to_container(cfg, resolve=True))
    log_params(flatten(resolved))
    log_text(OmegaConf.to_yaml(OmegaConf.create(resolved)), "config/resolved.yaml")
