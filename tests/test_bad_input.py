"""The bad input catalogue (issue 7) not covered beside its feature: each kind is one ConfigError line saying
what was wrong and what to do, raised before any model is built or measured, with nothing recorded lost."""
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import REPO, compose
from omegaconf import OmegaConf

from experiments import cli
from experiments.climb.validation import validate
from experiments.core.artefacts import cached
from experiments.core.errors import ConfigError
from experiments.core.recipe import Env
from experiments.record import tracking

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
                                       r".*onnxruntime, .*torch_compile, vllm, vllm_defaults\.$"),
    (["ladder=nope"], r"ladder 'nope' has no config conf/ladder/nope.yaml\. use one of: default, engine-swap, llama-cpp, serving, serving-quantized, vllm\.$"),
    (["benchmark.no_such_key=1"], r"override benchmark.no_such_key names a key the config does not have\. check "
                                  r"its spelling .*\+benchmark.no_such_key=\.\.\. to add a new key"),
    (["benchmark.concurrency=[1"], r"override 'benchmark.concurrency=\[1' does not parse .*quote a value"),
    (["target=tiny-llm,minilm"], r"override target=tiny-llm,minilm gives several values\. add --multirun"),
    (["--multirun", "target=tiny-llm,nope"], r"target 'nope' has no config .* use one of: folder, minilm, smollm2, tiny-llm"),
])
def test_a_bad_override_is_one_line_before_hydra_runs(args, message, monkeypatch, capsys, tmp_path):
    err = run_cli(monkeypatch, capsys, "sweep", *args, f"data_dir={tmp_path}")
    assert re.search(message, err), err
    assert not (tmp_path / "hydra").exists()   # refused before Hydra made a run folder


def test_other_commands_refuse_a_bad_override_the_same_way(monkeypatch, capsys, tmp_path):
    err = run_cli(monkeypatch, capsys, "promote", "tracking=nope", f"data_dir={tmp_path}")
    assert re.search(r"tracking 'nope' has no config conf/tracking/nope.yaml\. use one of: .*local", err), err


def test_a_refused_sweep_prints_one_error_and_exits_2(tmp_path):


    # its own process: Hydra's job logging would outlive pytest's capture of this one
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "sweep", f"data_dir={tmp_path}",
                           "ladder.required=[nope]"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ladder.required names 'nope', which is not in the ladder" in proc.stderr
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


def test_an_artefact_made_by_changed_code_is_made_again(tmp_path, monkeypatch):
    """The test cache outlives checkouts: the same recipe built by another version of its builder's module is
    another artefact, not the old one reused."""
    monkeypatch.syspath_prepend(str(tmp_path))
    folders = []
    for version in (1, 2):
        (tmp_path / f"builder_v{version}.py").write_text(
            f"VERSION = {version}\n\ndef build(folder):\n    (folder / 'model.bin').write_text(str(VERSION))\n")
        module = __import__(f"builder_v{version}")
        folders.append(cached(tmp_path / "cache", "ort-fp32", {"k": 1}, module.build, print))
    (v1, reused1), (v2, reused2) = folders
    assert v1 != v2 and not reused1 and not reused2
    assert (v1 / "model.bin").read_text() == "1" and (v2 / "model.bin").read_text() == "2"


# --- issue 20: types and ranges, one boundary, no secret printed, no champion is a failure --------------------
def numeric_leaves(node, prefix: str = ""):
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from numeric_leaves(value, f"{path}.")
        elif value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
                isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value)):
            yield path


# numbers that are not settings a user tunes: a rung's own arguments (checked by its class) and the model build;
# null words checked by their own readers (a kind by experiments.targets.kinds, a corpus path by its reader, the gated
# metric by gate.check_config and experiments/judge/task_metrics.py)
NOT_TABLED = ("ladder.*", "target.build.*", "isolation.rungs", "accuracy.include_path", "hardware.peak_*",
              "benchmark.slos", "diagnosis.next_rung.*", "target.workload.corpus",
              "target.kind", "gate.accuracy.metric", "target.draft_model")


@pytest.mark.parametrize("target", ["tiny-llm", "minilm", "smollm2", "folder"])
def test_every_numeric_setting_in_conf_has_a_type_and_a_range(target):
    from fnmatch import fnmatch

    from conftest import CONF_DIR
    from hydra import compose as hydra_compose, initialize_config_dir

    from experiments.core.settings import SETTINGS

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=["data_dir=/tmp/unused", f"target={target}",
                                                             *(["target.source=/tmp/unused"] * (target == "folder"))])
    tabled = [s.key for s in SETTINGS] + list(NOT_TABLED)
    missing = [k for k in numeric_leaves(OmegaConf.to_container(cfg, resolve=True))
               if not any(fnmatch(k, pattern) for pattern in tabled)]
    assert not missing, f"add these to experiments/core/settings.py SETTINGS: {missing}"


@pytest.mark.parametrize("override, message", [
    ("benchmark.concurrency=[abc]", r"benchmark.concurrency must list integers >= 1 and <= 1024 "
                                    r"\(benchmark.max_concurrency\), got \['abc'\]\. e.g. benchmark.concurrency="),
    ("gate.min_gain=2", r"gate.min_gain=2 is not a number in \[0, 1\)\. give the share a challenger must beat"),
    ("target=smollm2 target.agreement.min_share=2", r"target.agreement.min_share=2 is not a number in \[0, 1\]\. "
                                                     r"give the share of prompts"),
    ("benchmark.min_duration_s=-1", r"benchmark.min_duration_s=-1 is not a number >= 0 and <= 120 "
                                    r"\(benchmark.max_duration_s\)"),
    ("benchmark.concurrency=[1,100000000]", r"got \[1, 100000000\]\. .*each client is a thread holding requests in "
                                            r"memory.*raise benchmark.max_concurrency"),
    ("isolation.memory_limit_gb=0", r"isolation.memory_limit_gb=0 is not a number \(or null\) > 0\. null takes "
                                    r"isolation.memory_fraction"),
    ("target.workload.prompts=some/file.jsonl", r"target.workload.prompts file some/file.jsonl does not exist\."
                                                r" pass a JSONL file"),
    ("gate.confidence=1.5", r"gate.confidence=1.5 is not a number in \(0, 1\)"),
    ("soak.max_error_rate=2", r"soak.max_error_rate=2 is not a number in \[0, 1\]"),
    ("+isolation.rungs.int8={time_limit_s:-5}", r"isolation.rungs.int8.time_limit_s=-5 is not a number > 0"),
    ("benchmark.max_concurrency=0", r"benchmark.max_concurrency=0 is not an integer >= 1"),
    ("capacity.headroom=true", r"capacity.headroom=True is not a number in \[1, 3\]"),
])
def test_numeric_settings_are_checked_for_type_and_range_before_work(override, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        validate(compose([f"data_dir={tmp_path}", *override.split(" ")]), CPU)


def test_the_concurrency_ceiling_is_a_setting(tmp_path):
    cfg = compose([f"data_dir={tmp_path}", "benchmark.concurrency=[1,2048]", "benchmark.max_concurrency=4096"])
    assert validate(cfg, CPU)


PLANTED = "planted-Pw-7319"


def database_uri(port: int) -> str:
    return f"postgresql://roi:{PLANTED}@127.0.0.1:{port}/mlflow"


def uncreatable_folder(tmp_path: Path) -> Path:
    (tmp_path / "a-file").write_text("not a folder")
    return tmp_path / "a-file" / "data"


# each row of issue 20's table as a user runs it: its own process, a planted password on every command line
ROWS = [
    ("benchmark.concurrency=[abc]", r"benchmark.concurrency must list integers >= 1"),
    ("gate.min_gain=2", r"gate.min_gain=2 is not a number in \[0, 1\)"),
    ("benchmark.min_duration_s=-1", r"benchmark.min_duration_s=-1 is not a number >= 0"),
    ("benchmark.concurrency=[1,100000000]", r"benchmark.concurrency must list integers >= 1 and <= 1024 \(benchmark"
                                            r".max_concurrency\), got \[1, 100000000\]\. .*a level above benchmark"
                                            r".max_concurrency would exhaust the machine"),
    ("isolation.memory_limit_gb=0", r"isolation.memory_limit_gb=0 is not a number \(or null\) > 0"),
    ("data_dir=UNCREATABLE", r"data directory .*a-file/data is not writable \(.*\)\. set data_dir="),
    ("target.workload.prompts=some/file.jsonl", r"target.workload.prompts file some/file.jsonl does not exist"),
    ("tracking.uri=DATABASE", r"the MLflow database at postgresql://roi:\*\*\*@127.0.0.1:\d+/mlflow is unreachable "
                              r"\(.*refused.*\)\. start it"),
]


@pytest.mark.parametrize("row, message", ROWS, ids=[r for r, _ in ROWS])
def test_each_bad_input_row_of_issue_20_is_one_line_exit_2_without_traceback_or_password(row, message, tmp_path):


    port = free_port()
    args = [f"data_dir={tmp_path / 'data'}", f"tracking.uri={database_uri(port)}"]
    if row == "data_dir=UNCREATABLE":
        args[0] = f"data_dir={uncreatable_folder(tmp_path)}"
    elif row != "tracking.uri=DATABASE":
        args.append(row)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "sweep", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out and PLANTED not in out, out
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(rf"^error: {message}", lines[0]) and lines[0].endswith("."), out
    assert not list(tmp_path.rglob("cache")), "refused after a model was built"
    for saved in tmp_path.rglob("*.yaml"):                 # Hydra's record of the job's overrides and config
        assert PLANTED not in saved.read_text(), saved
    assert time.perf_counter() - started < 60


def test_a_folder_hydra_cannot_create_is_one_line(tmp_path):
    # a real process: Hydra's job logging set up in pytest's own process closes pytest's captured stderr
    folder = uncreatable_folder(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "sweep", f"data_dir={tmp_path}",
                           f"hydra.run.dir={folder}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"error: could not create or write {folder} (Not a directory). set data_dir=... " \
                                  "or ROI_LADDER_HOME to a writable folder.", proc.stderr


def test_an_unexpected_error_is_one_line_with_its_traceback_in_a_file(monkeypatch, capsys):
    def broken(*_):
        raise RuntimeError(f"engine exploded at postgresql://u:{PLANTED}@db/x")

    monkeypatch.setattr(cli, "_registry_command", broken)
    monkeypatch.setattr(sys, "argv", ["roi-ladder", "status"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 1 and "\n" not in err and PLANTED not in err, err
    assert err.startswith("error: RuntimeError: engine exploded at postgresql://u:***@db/x. this is not a known "
                          "input mistake; the traceback is in "), err
    kept = Path(err.split("the traceback is in ")[1].split(", report it")[0])
    assert "Traceback" in kept.read_text() and PLANTED not in kept.read_text()
    kept.unlink()


def test_the_console_and_logs_are_scrubbed(capsys):
    import logging

    from experiments.core.secrets import guard_console

    guard_console()
    print(f"store at postgresql://u:{PLANTED}@db/x, token=hf_{'a' * 24}")
    logging.getLogger("hydra.core.utils").error("Error executing job with overrides: %s",
                                                [f"tracking.uri=mysql://u:{PLANTED}@db/x"])
    captured = capsys.readouterr()
    assert PLANTED not in captured.out + captured.err and "hf_aaaa" not in captured.out
    assert "postgresql://u:***@db/x" in captured.out


# --- tracking backends fail fast, whatever the scheme --------------------------------------------------------
def test_an_unreachable_database_is_refused_in_seconds_without_its_password(tmp_path):
    uri = database_uri(free_port())
    started = time.perf_counter()
    with pytest.raises(ConfigError) as refused:
        tracking.connect(tracking_cfg(uri, tmp_path))
    assert time.perf_counter() - started < 10            # not MLflow's two minutes of retries
    assert re.search(r"the MLflow database at postgresql://roi:\*\*\*@127.0.0.1:\d+/mlflow is unreachable "
                     r"\(.*Connection refused.*\)\. start it", str(refused.value)) and PLANTED not in str(refused.value)


def test_a_database_that_accepts_but_never_answers_is_refused_in_seconds(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()                                     # the kernel accepts; nothing ever answers
    try:
        started = time.perf_counter()
        with pytest.raises(ConfigError, match=r"the MLflow database at postgresql://roi:\*\*\*@.* (is unreachable|did "
                                              r"not answer)"):
            tracking.connect(tracking_cfg(database_uri(listener.getsockname()[1]), tmp_path))
        assert time.perf_counter() - started < 10
    finally:
        listener.close()


def test_a_database_without_its_driver_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"tracking.uri=mssql\+nosuchdriver://u:\*\*\*@h/db .*(driver|cannot be "
                                          r"used)"):
        tracking.connect(tracking_cfg(f"mssql+nosuchdriver://u:{PLANTED}@h/db", tmp_path))


def test_an_unwritable_sqlite_store_is_refused(tmp_path):
    db = uncreatable_folder(tmp_path) / "mlflow.db"
    with pytest.raises(ConfigError, match=rf"the sqlite store tracking.uri=sqlite:///{db} is not writable \(.*\)\. "
                                          r"point tracking.uri at"):
        tracking.connect(tracking_cfg(f"sqlite:///{db}", tmp_path))


# --- a sweep without a champion -------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_sweep_whose_baseline_fails_exits_non_zero_with_the_reason_last(tmp_path):
    import os

    from conftest import REPO, SHARED_CACHE
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "sweep", "profile=quick", "ladder=engine-swap",
                           "ladder.rungs.baseline._target_=faults.FailingBaseline", "isolation.enabled=false",
                           f"data_dir={tmp_path}", f"cache_dir={SHARED_CACHE}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the sweep has no champion: the baseline failed (RuntimeError: scripted baseline "
                           "failure: the model does not load). fix that and run the sweep again; its runs stay "
                           "recorded in sqlite:///"), proc.stderr
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("roi-ladder/tiny-llm").experiment_id])
    verdicts = {r.data.tags.get("roi.rung"): r.data.tags.get("roi.verdict") for r in runs if "roi.rung" in r.data.tags}
    assert verdicts == {"baseline": "failed", "onnxruntime": "skipped"}


def test_a_multirun_of_refusals_echoes_no_password_and_exits_2(tmp_path):


    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "sweep", "--multirun", f"data_dir={tmp_path}",
                           f"tracking.uri={database_uri(free_port())}", "gate.min_gain=2,3"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    assert PLANTED not in out and "postgresql\\://roi\\:***@" in out, out   # Hydra's escaped echo, masked
    assert [line[:25] for line in proc.stderr.splitlines()] == ["error: gate.min_gain=2 is", "error: gate.min_gain=3 is"]
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and PLANTED in p.read_text(errors="replace")]
    assert not leaked, leaked


@pytest.mark.parametrize("override,message", [
    ("benchmark.mode=half-open", "benchmark.mode 'half-open' is unknown. use one of ('closed', 'open')"),
    ("gate.objective.stat=p42", "gate.objective.stat 'p42' is unknown. use one of ('mean', 'p50', 'p95', 'p99')"),
])
def test_word_settings_are_one_of_their_choices_from_the_settings_table(override, message):
    from experiments.core.errors import ConfigError
    from experiments.core.settings import check_settings

    with pytest.raises(ConfigError) as err:
        check_settings(compose([override]), "benchmark.", "gate.")
    assert str(err.value).startswith(message), str(err.value)
