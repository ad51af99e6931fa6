"""`roi-ladder ui` serves the MLflow UI on loopback only, and stops with its whole process group."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_of(request) -> int:
    try:
        return urllib.request.urlopen(request, timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_ui_binds_loopback_and_prints_where_to_look(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "experiments.cli", "ui", f"data_dir={tmp_path}",
                             f"tracking.ui_port={port}"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[0].startswith("MLflow UI for sqlite:///"), lines
        assert f"latest sweep: http://127.0.0.1:{port}/" in lines[1] and "no sweep recorded yet" in lines[1]
        deadline, status = time.time() + 90, None
        while time.time() < deadline and status is None:
            try:
                status = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status
            except OSError:
                time.sleep(0.5)
        assert status == 200
        bound = [c.laddr.ip for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert bound and set(bound) == {"127.0.0.1"}
        # MLflow's security middleware is on: a foreign Host header (DNS rebinding) and a foreign origin's
        # preflight (a page elsewhere driving the API with the user's browser) are refused
        api = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1"
        assert status_of(urllib.request.Request(api)) == 200
        assert status_of(urllib.request.Request(api, headers={"Host": "evil.example.com"})) == 403
        for origin, allowed in (("http://evil.example.com", False), (f"http://127.0.0.1:{port}", True)):
            preflight = urllib.request.Request(api, method="OPTIONS", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST"})
            assert (status_of(preflight) == 200) is allowed, origin
    finally:
        os.killpg(proc.pid, signal.SIGTERM)       # only the group this test started
        proc.wait(timeout=30)
