"""The embedding target end to end: a real sweep of the pretrained MiniLM on the quick profile, checked in the
MLflow store it wrote. The rungs that cannot help an encoder are in the ladder on purpose: their own checks
must turn them down with a reason."""
import subprocess
import sys

import pytest
from conftest import REPO, SHARED_CACHE
from mlflow.tracking import MlflowClient
from verdicts import assert_decided

pytestmark = pytest.mark.slow
# the default ladder less the rungs that cost minutes here without testing anything new for an encoder
DROPPED = ["torch_compile", "tensorrt", "static_batching", "cuda_graph", "half_precision", "int4", "fp8"]
LADDER = ["baseline", "onnxruntime", "openvino", "dynamic_batching", "continuous_batching", "int8",
          "prefix_caching", "distillation"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    data = tmp_path_factory.mktemp("minilm")
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", "target=minilm", "profile=quick", f"data_dir={data}",
           f"cache_dir={SHARED_CACHE}", "target.scoring.queries=120", "target.workload.texts=120",
           *[f"~ladder.rungs.{name}" for name in DROPPED]]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{data}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("roi-ladder/minilm").experiment_id])
    return client, runs


def test_every_rung_has_a_verdict_and_encoder_misfits_say_why(sweep):
    _, runs = sweep
    children = {r.data.tags["roi.rung"]: r for r in runs if r.data.tags.get("roi.kind") == "rung"}
    assert sorted(children) == sorted(LADDER)
    verdicts = {name: r.data.tags["roi.verdict"] for name, r in children.items()}
    assert "failed" not in verdicts.values(), {n: children[n].data.tags["roi.reason"] for n in children}
    for name in ("continuous_batching", "prefix_caching", "distillation"):
        assert verdicts[name] == "skipped" and "encoder" in children[name].data.tags["roi.reason"]
    for name in ("onnxruntime", "openvino", "dynamic_batching"):        # exact: the baseline's embeddings
        assert_decided(children[name].data, name, passes=("fidelity",))
    assert_decided(children["int8"].data, "int8")


def test_encoder_metrics_and_gate(sweep):
    client, runs = sweep
    by_rung = {r.data.tags.get("roi.rung"): r for r in runs}
    base = by_rung["baseline"].data.metrics
    assert base["embeddings_per_s"] > 0 and base["e2e_ms_p50"] > 0 and base["batch_ms_p50"] > 0
    assert not [k for k in base if k.startswith(("ttft", "tpot", "itl"))]
    assert 0.3 < base["accuracy/minilm_retrieval/recall_5"] <= 1          # a real pretrained model retrieves
    assert base["cosine_mean"] > 0.99999                                  # the baseline against itself
    int8 = by_rung["int8"].data
    assert 0.9 < int8.metrics["cosine_mean"] < 0.9999 and 7.5 < int8.metrics["weight_bits"] < 8.6
    assert "cosine vs fp32 baseline" in int8.tags["roi.gate.fidelity"]
    assert "minilm_retrieval recall@1" in int8.tags["roi.gate.accuracy_recall_1"]
    assert "minilm_retrieval recall@5" in int8.tags["roi.gate.accuracy_recall_5"]
    batched = by_rung["dynamic_batching"].data.metrics
    assert batched["batch_size_mean"] > 1        # at c=2 the two clients' requests share batches
    files = [f.path for f in client.list_artifacts(by_rung["baseline"].info.run_id, "benchmark")]
    assert "benchmark/samples.csv" in files
