"""tracking=server against a real `mlflow server` on PostgreSQL (the pieces of `make server-check` without its
sweep, which takes ~4.5 min here: that one is a make target). Skipped, with the reason, where PostgreSQL is
absent and cannot be installed (apt-get and root)."""
import shutil
import tempfile
from pathlib import Path

import mlflow
import pytest
from conftest import compose
from mlflow.tracking import MlflowClient

from experiments.record import tracking
from experiments.tools.server_check import Postgres, can_run_postgres, ensure_postgres, start_mlflow_server
from experiments.tools.ui_check import free_port, stop_group, wait_healthy

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(can_run_postgres() is not None, reason=f"{can_run_postgres()}: the server-mode "
                                                                        "check needs a PostgreSQL")]


def test_a_run_recorded_with_tracking_server_lands_in_postgresql_and_its_artefacts_go_through_the_server(tmp_path):
    scratch = Path(tempfile.mkdtemp(prefix="roi-server-mode-"))   # not under pytest's 0700 folder:
    scratch.chmod(0o755)                                           # PostgreSQL's own user must reach it
    pg = Postgres(ensure_postgres(), scratch / "pg", free_port())
    port, server, previous = free_port(), None, mlflow.get_tracking_uri()
    try:
        pg.start()
        server = start_mlflow_server(pg.uri, tmp_path / "artifacts", port, tmp_path / "mlflow-server.log")
        wait_healthy(port, server)
        uri = f"http://127.0.0.1:{port}"
        cfg = compose(["tracking=server", f"tracking.uri={uri}", f"data_dir={tmp_path / 'data'}"]).tracking
        experiment_id = tracking.connect(cfg)
        with tracking.run("server-mode", experiment_id, tags={"roi.kind": "sweep"}) as run:
            tracking.log_text("hello", "config/resolved.yaml")
            mlflow.log_metric("qps", 1.5)
        got = MlflowClient(tracking_uri=uri).get_run(run.info.run_id)
        assert got.data.metrics["qps"] == 1.5 and got.info.artifact_uri.startswith("mlflow-artifacts:")
        stored = list((tmp_path / "artifacts").rglob(f"{run.info.run_id}/artifacts/config/resolved.yaml"))
        assert len(stored) == 1 and stored[0].read_text() == "hello"            # uploaded through the server
        assert not (tmp_path / "data").exists()                                # nothing written beside the client
        rows = pg.count_rows(("experiments", "runs", "metrics"))
        assert rows["runs"] == 1 and rows["metrics"] == 1 and rows["experiments"] == 2    # + MLflow's Default
        tracking.connect(cfg)                                                    # again: finds it, creates none
        assert pg.count_rows(("experiments",))["experiments"] == 2
    finally:
        mlflow.set_tracking_uri(previous)
        if server is not None:
            stop_group(server)
        pg.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    assert pg.proc.poll() is not None and server.poll() is not None             # both stopped
