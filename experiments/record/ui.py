"""`make ui`: the MLflow UI on loopback, pointed at this project's store."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from mlflow.tracking import MlflowClient

from experiments.core.names import Tag
from experiments.core.secrets import scrub_text

# MLflow 3 opens an experiment on its GenAI view unless the experiment says it is model development; the
# per-browser GenAI/Model-training switch is overridden by this query in the page URL (measured, 3.17.2).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
RUNS_VIEW = "workflowType=machine_learning"


def ui_base(tracking_cfg) -> str:
    """The address of the UI for this store: the server itself, or `make ui` on loopback."""
    uri = str(tracking_cfg.uri)
    if uri.startswith(("http://", "https://")):
        return scrub_text(uri).rstrip("/")
    return f"http://{tracking_cfg.ui_host}:{tracking_cfg.ui_port}"


def experiment_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}?{RUNS_VIEW}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{RUNS_VIEW}"


def ladder_view(parent_run_id: str, key_metrics: tuple[str, ...]) -> dict:
    """A runs-table view of one sweep, as the UI's Share button stores it: its rungs listed flat (grouping by
    run kind lists child runs that nesting would fold under the sweep), the target kind's key metrics, verdict and
    reason as columns."""
    return {"searchFilter": f"tags.mlflow.parentRunId = '{parent_run_id}'",
            "selectedColumns": [f"metrics.`{m}`" for m in key_metrics] +
                               [f"tags.`{Tag.RUNG}`", f"tags.`{Tag.VERDICT}`", f"tags.`{Tag.REASON}`"],
            "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": Tag.KIND}]}}


def save_ladder_view(client, experiment_id: str, key: str, parent_run_id: str, key_metrics: tuple[str, ...]) -> None:
    client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{key}",
                              json.dumps(ladder_view(parent_run_id, key_metrics)))


def ladder_view_url(base: str, experiment_id: str, key: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs?viewStateShareKey={key}&{RUNS_VIEW}"


def latest_sweep_url(uri: str, experiment: str, base: str) -> str:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return f"{base}/  (no sweep recorded yet: run `make sweep`)"
    runs = client.search_runs([exp.experiment_id], f"tags.`{Tag.KIND}` = 'sweep'", max_results=1,
                              order_by=["attributes.start_time DESC"])
    if not runs:
        return experiment_url(base, exp.experiment_id)
    sweep = runs[0]
    return (f"{ladder_view_url(base, exp.experiment_id, 'sweep-' + sweep.data.tags.get(Tag.SWEEP, ''))}\n"
            f"  its run (description, report.html): {run_url(base, exp.experiment_id, sweep.info.run_id)}")


def serve_ui(cfg) -> int:
    t = cfg.tracking
    base = ui_base(t)
    if str(t.uri).startswith(("http://", "https://")):     # tracking=server: the server is the UI
        print(f"MLflow UI of the server {base}\n  latest sweep: "
              f"{latest_sweep_url(str(t.uri), str(t.experiment), base)}", flush=True)
        return 0
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
