"""The bad input catalogue (issue 7) not covered beside its feature: each kind is one ConfigError line saying
what was wrong and what to do, raised before any model is built or measured, with nothing recorded lost."""
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import compose
from experiments import cli, tracking
from experiments.artefacts import cached
from experiments.errors import ConfigError
from experiments.validation import validate
from optimizers.base import Env

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
GPU = Env(cuda=True, cuda_capability=(9, 0), cpu_count=16)


def run_cli(monkeypatch, capsys, *argv) -> str:
    """What `roi-ladder ARGV` prints on stderr; it must exit 2 with one `error:` line."""
    monkeypatch.setattr(sys, "argv", ["roi-ladder", *argv])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize("args, message", [
    (["+rung@ladder.rungs.nope=nope"], r"rung 'nope' has no config conf/rung/nope.yaml\. use one of: baseline, "
                                       r".*onnxruntime, .*torch_compile\.$"),
    (["ladder=nope"], r"ladder 'nope' has no config conf/ladder/nope.yaml\. use one of: default, engine-swap\.$"),
    (["benchmark.no_such_key=1"], r"override benchmark.no_such_key names a key the config does not have\. check "
                                  r"its spelling .*\+benchmark.no_such_key=\.\.\. to add a new key"),
    (["benchmark.concurrency=[1"], r"override 'benchmark.concurrency=\[1' does not parse .*quote a value"),
    (["target=tiny-llm,minilm"], r"override target=tiny-llm,minilm gives several values\. add --multirun"),
    (["--multirun", "target=tiny-llm,nope"], r"target 'nope' has no config .* use one of: minilm, tiny-llm"),
])
def test_a_bad_override_is_one_line_before_hydra_runs(args, message, monkeypatch, capsys, tmp_path):
    err = run_cli(monkeypatch, capsys, "sweep", *args, f"data_dir={tmp_path}")
    assert re.search(message, err), err
    assert not (tmp_path / "hydra").exists()   # refused before Hydra made a run folder


def test_other_commands_refuse_a_bad_override_the_same_way(monkeypatch, capsys, tmp_path):
    err = run_cli(monkeypatch, capsys, "promote", "tracking=nope", f"data_dir={tmp_path}")
    assert re.search(r"tracking 'nope' has no config conf/tracking/nope.yaml\. use one of: .*local", err), err


def test_a_refused_sweep_prints_one_error_and_exits_2(tmp_path):
    import subprocess

    from conftest import REPO

    # its own process: Hydra's job logging would outlive pytest's capture of this one
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "sweep", f"data_dir={tmp_path}",
                           "ladder.required=[nope]"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ladder.required names 'nope', which is not in the ladder" in proc.stdout
    assert not (tmp_path / "cache").exists()      # no model built


def test_a_rung_entry_without_target_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"rung 'x' has no _target_\. point _target_ at an Optimizer class"):
        validate(compose([f"data_dir={tmp_path}", "+ladder.rungs.x.precision=fp16"]), CPU)


def test_a_ladder_listing_a_rung_twice_is_refused(tmp_path):
    cfg = compose([f"data_dir={tmp_path}", "+rung@ladder.rungs.onnxruntime_again=onnxruntime"])
    with pytest.raises(ConfigError, match=r"lists one rung twice: 'onnxruntime_again' has the same config as "
                                          r"'onnxruntime'\. drop 'onnxruntime_again'"):
        validate(cfg, CPU)
    other = compose([f"data_dir={tmp_path}", "+rung@ladder.rungs.onnxruntime_cuda=onnxruntime",
                     "ladder.rungs.onnxruntime_cuda.execution_provider=cuda"])
    assert "onnxruntime_cuda" in dict(validate(other, CPU))   # same optimizer, other settings: a rung of its own


def test_a_ladder_not_starting_with_the_baseline_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="must start with the baseline rung.*first in the ladder's defaults"):
        validate(compose([f"data_dir={tmp_path}", "~ladder.rungs.baseline"]), CPU)


@pytest.mark.parametrize("rung, reason", [
    ("tensorrt", "TensorRT builds engines for an NVIDIA GPU: no CUDA device is present"),
    ("cuda_graph", "CUDA Graph replays GPU kernel launches: no CUDA device is present"),
    ("fp8", "FP8 needs a CUDA device"),
])
def test_a_required_gpu_rung_without_cuda_is_refused_instead_of_skipped(rung, reason, tmp_path):
    cfg = compose([f"data_dir={tmp_path}", f"ladder.required=[{rung}]"])
    with pytest.raises(ConfigError, match=rf"rung '{rung}' is required \(ladder.required\) but cannot run on this "
                                          rf"machine: {reason}.*drop '{rung}' from ladder.required"):
        validate(cfg, CPU)
    assert validate(compose([f"data_dir={tmp_path}"]), CPU)            # not required: skipped in the sweep
    if rung != "tensorrt":                                              # tensorrt also needs torch-tensorrt
        assert validate(cfg, GPU)


def test_a_required_rung_outside_the_ladder_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"ladder.required names 'tensorrt', which is not in the ladder "
                                          r"\(baseline, onnxruntime\)\. add conf/rung/tensorrt.yaml"):
        validate(compose([f"data_dir={tmp_path}", "ladder=engine-swap", "ladder.required=[tensorrt]"]), CPU)


@pytest.mark.parametrize("override, message", [
    ("threads=0", r"threads=0 is not an integer >= 1\. set threads to the cores"),
    ("threads=-2", r"threads=-2 is not an integer >= 1"),
    ("gate.objective.stat=p42", r"gate.objective.stat 'p42' is unknown\. use one of \('mean', 'p50'"),
    ("accuracy.include_path=/no/such/tasks", r"accuracy.include_path /no/such/tasks is not a folder\. point it at"),
])
def test_more_bad_settings_are_refused_before_work(override, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        validate(compose([f"data_dir={tmp_path}", override]), CPU)


def test_a_refusal_leaves_what_was_recorded_alone(tmp_path):
    recorded = {"mlflow.db": b"sqlite store", "mlartifacts/run/a.txt": b"artefact", "cache/models/m/x": b"w"}
    for rel, data in recorded.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    for override in ("threads=0", "ladder.required=[tensorrt]", "+rung@ladder.rungs.again=onnxruntime",
                     "target.source=/no/such/model"):
        with pytest.raises(ConfigError):
            validate(compose([f"data_dir={tmp_path}", override]), CPU)
    with pytest.raises(ConfigError):
        tracking.connect(OmegaConf.create({"uri": "foo://x", "artifact_root": str(tmp_path / "mlartifacts"),
                                           "experiment": "e"}))
    assert {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == recorded


# --- the MLflow store -------------------------------------------------------------------------------------
def tracking_cfg(uri: str, tmp_path: Path, experiment: str = "roi-ladder/t"):
    return OmegaConf.create({"uri": uri, "artifact_root": str(tmp_path / "mlartifacts"), "experiment": experiment})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_mlflow_server_is_refused_in_seconds(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"the MLflow server at {uri} is unreachable \(.*refused.*\)\. start it "
                                          r".*or record locally with tracking=local"):
        tracking.connect(tracking_cfg(uri, tmp_path))
    assert time.perf_counter() - started < 10    # not MLflow's minutes of retries


class Failing(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(500)
        self.end_headers()
        self.wfile.write(b"database is locked")

    do_POST = do_GET

    def log_message(self, *args):
        pass


def test_an_mlflow_server_answering_errors_is_refused(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        started = time.perf_counter()
        with pytest.raises(ConfigError, match=rf"the MLflow server at {uri} answers HTTP 500 .*check the server's "
                                              r"log"):
            tracking.connect(tracking_cfg(uri, tmp_path))
        assert time.perf_counter() - started < 10
    finally:
        server.shutdown()
        server.server_close()


def test_an_unknown_tracking_uri_scheme_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"tracking.uri=foo://x cannot be used \(.*unsupported URI 'foo://x'.*\)\. "
                                          r"set tracking.uri to sqlite:///"):
        tracking.connect(tracking_cfg("foo://x", tmp_path))


def test_an_empty_experiment_name_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="tracking.experiment is empty. name the MLflow experiment"):
        tracking.connect(tracking_cfg(f"sqlite:///{tmp_path}/mlflow.db", tmp_path, experiment=" "))
    assert not (tmp_path / "mlflow.db").exists()


# --- cached artefacts ---------------------------------------------------------------------------------------
def test_a_corrupted_cached_artefact_is_detected_by_checksum_and_rebuilt(tmp_path):
    builds, notes = [], []

    def build(folder: Path) -> None:
        builds.append(folder)
        (folder / "model.onnx").write_bytes(bytes(range(256)) * 4)
        (folder / "sub").mkdir()
        (folder / "sub" / "config.json").write_text('{"layers": 2}')

    first, reused = cached(tmp_path, "ort-fp32", {"k": 1}, build, notes.append)
    assert not reused and len(builds) == 1 and (first / "manifest.json").exists()
    assert cached(tmp_path, "ort-fp32", {"k": 1}, build, notes.append) == (first, True) and not notes

    data = bytearray((first / "model.onnx").read_bytes())
    data[100] ^= 0xFF                                  # one flipped byte, same size and name
    (first / "model.onnx").write_bytes(bytes(data))
    again, reused = cached(tmp_path, "ort-fp32", {"k": 1}, build, notes.append)
    assert again == first and not reused and len(builds) == 2
    assert (again / "model.onnx").read_bytes() == bytes(range(256)) * 4
    assert notes == [f"cached artefact {first} failed its checksum (a file changed or is missing); rebuilding it"]

    (first / "sub" / "config.json").unlink()           # a missing file is caught the same way
    assert cached(tmp_path, "ort-fp32", {"k": 1}, build, notes.append) == (first, False) and len(notes) == 2
