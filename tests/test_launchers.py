"""Scale-out on Hydra's launchers: sweeps in parallel (joblib) and as submitit jobs, into one MLflow store.

The sweeps are the plumbing profile (conf/profile/plumbing.yaml: one level, 20 documents, no rounds, no soak) on the
two-rung engine-swap ladder: what is checked here is where the runs land, not what they measure."""
import multiprocessing
import os
import subprocess
import sys
import time

import pytest
from conftest import REPO, SHARED_CACHE, compose
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

RUNGS = ["baseline", "onnxruntime"]
FAST = ["ladder=engine-swap", "profile=plumbing"]
# Two jobs on this machine's 2 cores: one engine thread each (two threads each ran ~2x slower, oversubscribed).
# tiny-llm's build keeps 2 threads, the build the model_dir fixture made (a build's threads are in its hash);
# `++` because minilm has no build section (it ignores the key).
ONE_THREAD_EACH = ["threads=1", "++target.build.threads=2"]


def _sweep(args: list[str], data, timeout: int = 1200) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", "--multirun", *args, *FAST, f"data_dir={data}",
           f"cache_dir={SHARED_CACHE}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _sweeps_by_target(client: MlflowClient) -> dict[str, tuple]:
    """target -> (experiment name, parent run, its child runs); every run of the store is one of these."""
    experiments = {e.experiment_id: e.name for e in client.search_experiments() if e.name.startswith("roi-ladder/")}
    runs = client.search_runs(list(experiments))
    parents = [r for r in runs if r.data.tags.get("roi.kind") == "sweep"]
    out = {}
    for p in parents:
        kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id]
        assert p.data.tags["roi.target"] not in out, "two sweeps of one target"
        out[p.data.tags["roi.target"]] = (experiments[p.info.experiment_id], p, kids)
    accounted = {p.info.run_id for _, p, kids in out.values()} | {k.info.run_id for _, _, kids in out.values()
                                                                   for k in kids}
    assert {r.info.run_id for r in runs} == accounted, "runs that belong to no sweep"
    return out


def _check_sweep(experiment: str, parent, kids, target: str) -> None:
    assert experiment == f"roi-ladder/{target}"
    assert parent.info.status == "FINISHED"
    assert sorted(k.data.tags["roi.rung"] for k in kids) == sorted(RUNGS)      # each rung once
    verdicts = {k.data.tags["roi.rung"]: k.data.tags["roi.verdict"] for k in kids}
    # the baseline is the first champion; the swap is measured and judged either way (its speed is not the point)
    assert verdicts["baseline"] == "accepted" and verdicts["onnxruntime"] in ("accepted", "rejected", "undecided"), \
        {k.data.tags["roi.rung"]: k.data.tags["roi.reason"] for k in kids}
    for k in kids:
        assert k.info.experiment_id == parent.info.experiment_id and k.info.status == "FINISHED"
        # a load ladder measured in the job: a latency and a throughput, not only the machine's load at its start
        assert k.data.metrics.get("e2e_ms_p50", 0) > 0 and k.data.metrics.get("qps", 0) > 0, \
            f"rung {k.data.tags['roi.rung']} of {target} measured no load ladder: {sorted(k.data.metrics)[:8]}"
    assert parent.data.params["target.name"] == target and parent.data.tags["roi.target"] == target


# --- the store made ready for parallel writers (fast) ------------------------------------------------------
def _prepare_in_process(uri: str, root: str, barrier, out) -> None:
    from experiments.record.tracking import connect

    cfg = OmegaConf.create({"uri": uri, "artifact_root": root, "experiment": "roi-ladder/shared"})
    barrier.wait()
    try:
        out.put(connect(cfg))
    except Exception as exc:  # noqa: BLE001 (reported to the test, which fails on it)
        out.put(f"{type(exc).__name__}: {exc}")


def test_jobs_reaching_a_fresh_store_at_once_share_its_tables_and_experiment(tmp_path):
    """MLflow creates a fresh sqlite store's tables unguarded and experiments by unique name: three processes
    released together must all succeed and find the one experiment."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    procs = [ctx.Process(target=_prepare_in_process, args=(uri, str(tmp_path / "mlartifacts"), barrier, out))
             for _ in range(3)]
    for p in procs:
        p.start()
    answers = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert len(set(answers)) == 1 and answers[0].isdigit(), answers
    names = [e.name for e in MlflowClient(tracking_uri=uri).search_experiments()]
    assert names.count("roi-ladder/shared") == 1


def test_server_tracking_leaves_artefacts_to_the_server():
    cfg = compose(["tracking=server", "data_dir=/tmp/unused"])
    assert cfg.tracking.artifact_root is None and cfg.tracking.experiment == "roi-ladder/tiny-llm"
    assert cfg.tracking.uri == os.environ.get("ROI_LADDER_TRACKING_URI", "http://127.0.0.1:5000")


def test_the_launcher_configs_compose():
    slurm = compose(["hydra/launcher=slurm", "data_dir=/tmp/unused"]).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher") and slurm.timeout_min > 0 and slurm.cpus_per_task >= 1
    assert "export HF_HUB_OFFLINE=1" in slurm.setup
    assert compose(["hydra/launcher=joblib", "data_dir=/tmp/unused"]).hydra.launcher._target_.endswith(
        "JoblibLauncher")
    assert compose(["hydra/launcher=submitit_local", "data_dir=/tmp/unused"]).hydra.launcher._target_.endswith(
        "LocalLauncher")


# --- real sweeps (slow) ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_joblib_sweeps_two_targets_in_parallel_into_one_store(model_dir, tmp_path):
    started = time.perf_counter()
    proc = _sweep(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "target=tiny-llm,minilm", *ONE_THREAD_EACH],
                  tmp_path)
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")       # the one store both wrote
    sweeps = _sweeps_by_target(client)
    assert sorted(sweeps) == ["minilm", "tiny-llm"]
    for target, (experiment, parent, kids) in sweeps.items():
        _check_sweep(experiment, parent, kids, target)
    # in parallel: each sweep's parent run was open while the other's was
    (_, a, _), (_, b, _) = sweeps.values()
    assert max(a.info.start_time, b.info.start_time) < min(a.info.end_time, b.info.end_time), \
        "the two sweeps ran one after the other"
    print(f"joblib: two sweeps in {time.perf_counter() - started:.0f} s, overlapping "
          f"{(min(a.info.end_time, b.info.end_time) - max(a.info.start_time, b.info.start_time)) / 1000:.0f} s")


@pytest.mark.slow
def test_submitit_local_runs_the_sweep_as_a_job_into_the_store(model_dir, tmp_path):
    _sweep(["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=30", "target=tiny-llm"], tmp_path)
    job_logs = list((tmp_path / "hydra").glob("multirun-*/.submitit/*/*_log.out"))
    assert len(job_logs) == 1 and "ROI ladder" in job_logs[0].read_text()     # the sweep ran in submitit's job
    sweeps = _sweeps_by_target(MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    assert list(sweeps) == ["tiny-llm"]
    _check_sweep(*sweeps["tiny-llm"], "tiny-llm")
