"""`make ui`: the MLflow UI on loopback, pointed at this project's store."""
from __future__ import annotations

import os
import subprocess
import sys

from mlflow.tracking import MlflowClient


def latest_sweep_url(uri: str, experiment: str, base: str) -> str:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return f"{base}/  (no sweep recorded yet: run `make sweep`)"
    runs = client.search_runs([exp.experiment_id], "tags.`roi.kind` = 'sweep'", max_results=1,
                              order_by=["attributes.start_time DESC"])
    if not runs:
        return f"{base}/#/experiments/{exp.experiment_id}"
    return f"{base}/#/experiments/{exp.experiment_id}/runs/{runs[0].info.run_id}"


def serve_ui(cfg) -> int:
    t = cfg.tracking
    if str(t.uri).startswith(("http://", "https://")):     # tracking=server: the server is the UI
        from experiments.secrets import scrub_text

        shown = scrub_text(str(t.uri)).rstrip("/")
        print(f"MLflow UI of the server {shown}\n  latest sweep: "
              f"{latest_sweep_url(str(t.uri), str(t.experiment), shown)}", flush=True)
        return 0
    base = f"http://{t.ui_host}:{t.ui_port}"
    print(f"MLflow UI for {t.uri}\n  latest sweep: {latest_sweep_url(str(t.uri), str(t.experiment), base)}",
          flush=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", str(t.uri), "--host", str(t.ui_host),
           "--port", str(t.ui_port), "--workers", "1", "--allowed-hosts", str(t.ui_allowed_hosts),
           "--cors-allowed-origins", str(t.ui_cors_allowed_origins)]
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0
