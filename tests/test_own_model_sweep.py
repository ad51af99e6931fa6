"""A quick sweep on two random-weight folders of different architectures, through target.source, with a prompts
file and a local lm-eval task: what a user with their own model runs."""
import csv
import json
import os
import subprocess
import sys

import own_models
import pytest
from conftest import REPO
from mlflow.tracking import MlflowClient
from verdicts import assert_decided

pytestmark = pytest.mark.slow

TASK = """task: own_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: ""
metric_list:             # acc alone: the gate takes it (the default metric is unset)
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def task_folder(root):
    """A four-way multiple-choice lm-eval task of the user's own, YAML + local JSONL."""
    root.mkdir()
    words = ["alpha", "beta", "gamma", "delta", "return", "import", "class", "while"]
    docs = [{"context": f"def f{i}(x):\n    ", "choices": words[i % 5:i % 5 + 4], "label": i % 4} for i in range(24)]
    (root / "own_mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "own_mc.yaml").write_text(TASK.format(data=root / "own_mc.jsonl"))
    return root


def prompts(path, chat: bool):
    lines = [{"prompt": "def bisect(a, x):\n    "}, {"prompt": "import string\n", "max_tokens": 12}]
    if chat:
        lines.append({"messages": [{"role": "user", "content": "Wrap this text, please."}], "max_tokens": 8})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines * 4))
    return path


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_a_quick_sweep_on_a_users_folder(architecture, tmp_path):
    folder = own_models.build(tmp_path / f"my-{architecture.lower()}", architecture)
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", "profile=quick", "ladder=engine-swap", f"data_dir={data}",
           "target=folder", f"target.source={folder}",
           f"target.workload.prompts={prompts(tmp_path / 'prompts.jsonl', chat=architecture.startswith('Qwen2'))}",
           "accuracy.tasks=[own_mc]", f"accuracy.include_path={task_folder(tmp_path / 'tasks')}", "soak.enabled=false"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=os.environ)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{data}/mlflow.db")
    exp = client.get_experiment_by_name(f"roi-ladder/my-{architecture.lower()}")   # named after the folder
    runs = {r.data.tags.get("roi.rung"): r for r in client.search_runs([exp.experiment_id])}
    base, ort = runs["baseline"].data, runs["onnxruntime"].data
    assert base.tags["roi.verdict"] == "accepted"
    # an exact engine swap: gated on the user's task, fidelity and generation agreement, each passing
    assert_decided(ort, "onnxruntime", passes=("accuracy", "fidelity", "generation_agreement"))
    assert ort.params["recipe.engine"] == "onnxruntime"
    n_prompts = 12 if architecture.startswith("Qwen2") else 8
    assert base.metrics["agreement/n_prompts"] == n_prompts and base.metrics["agreement/share"] == 1.0
    assert 0 <= base.metrics["accuracy/own_mc/acc"] <= 1
    parent = runs[None].data
    assert parent.tags["roi.accuracy_metric"] == "own_mc: acc (the task's first per-document metric; " \
                                                 "gate.accuracy.metric is not set)"
    # capacity planned from the folder model's own measurements (or the reason no level met the tier)
    assert base.tags["roi.capacity"].startswith("no plan: ") or base.metrics["capacity/replicas"] >= 1
    # the measured requests are the file's, each with exactly its output length (end-of-sequence ignored)
    samples = client.download_artifacts(runs["baseline"].info.run_id, "benchmark/samples.csv", str(tmp_path))
    rows = [r for r in csv.DictReader(open(samples)) if not r["error"]]
    assert {int(r["output_tokens"]) for r in rows} <= {16, 32, 64, 12, 8} and 12 in {int(r["output_tokens"]) for r in rows}


def test_a_quick_sweep_on_a_users_embedding_folder_with_query_passage_pairs(tmp_path):
    from experiments.targets.models.minilm import RetrievalSet

    folder = own_models.encoder(tmp_path / "my-encoder")
    rs = RetrievalSet.from_stdlib(40, seed=5)
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"query": q, "passage": p}) + "\n" for q, p in zip(rs.queries, rs.passages))
                    + json.dumps({"text": "a text that is only embedded"}) + "\n")
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", "profile=quick", "ladder=engine-swap", f"data_dir={data}",
           "target=folder", f"target.source={folder}", f"target.workload.prompts={path}", "soak.enabled=false"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=os.environ)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{data}/mlflow.db")
    exp = client.get_experiment_by_name("roi-ladder/my-encoder")
    runs = {r.data.tags.get("roi.rung"): r for r in client.search_runs([exp.experiment_id])}
    base, ort = runs["baseline"].data, runs["onnxruntime"].data
    assert base.tags["roi.verdict"] == "accepted"
    assert_decided(ort, "onnxruntime", passes=("accuracy_recall_1", "accuracy_recall_5", "fidelity"))
    assert runs[None].data.params["target.kind"] == "embedding"                # the sweep's run: the config
    # recall@k over the user's 40 pairs, gated against the champion's; cosine over all 81 texts
    assert 0 <= base.metrics["accuracy/retrieval_pairs/recall_1"] <= base.metrics["accuracy/retrieval_pairs/recall_5"]
    assert "retrieval_pairs recall@5" in ort.tags["roi.gate.accuracy_recall_5"]
    assert "over 81 texts" in ort.tags["roi.gate.fidelity"]
