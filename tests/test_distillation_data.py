"""Distillation on a user's folder: no accuracy task, no student (skipped, or refused up front when forced or
required); with one, the student learns from the user's own text, and the run records which and how much."""
import json

import own_models
import pytest
from conftest import compose

from experiments.climb.validation import load_rungs, validate
from experiments.core.errors import ConfigError
from experiments.core.recipe import Candidate, Env, Target

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
TASK = """task: own_qa
dataset_path: json
dataset_kwargs:
  data_files:
    train: {train}
    test: {test}
training_split: {training_split}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
metadata:
  version: 1.0
"""


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return own_models.build(tmp_path_factory.mktemp("own") / "tiny-qwen2", "Qwen2ForCausalLM")


def task_folder(root, training_split="train"):
    """A multiple-choice task of the user's own: 6 training documents, 5 test documents."""
    root.mkdir()
    for split, n in (("train", 6), ("test", 5)):
        docs = [{"question": f"{split} question {i}:", "choices": ["yes", "no"], "label": i % 2} for i in range(n)]
        (root / f"{split}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / "own_qa.yaml").write_text(TASK.format(train=root / "train.jsonl", test=root / "test.jsonl",
                                                  training_split=training_split))
    return root


def folder_config(folder, tmp_path, *overrides):
    return compose(["target=folder", f"target.source={folder}", f"data_dir={tmp_path / 'data'}",
                    "target.distillation.steps=2", "target.distillation.batch_size=2",
                    "ladder.rungs.distillation.seq_len=16", *overrides])


def forced_rung(cfg):
    """The rung as the sweep builds it, forced: it runs whatever the (absent) benchmark says."""
    opt = dict(load_rungs(cfg))["distillation"]
    opt.force = True
    opt.observe(None)
    return opt


def champion(folder):
    return Candidate(Target("m", "causal-lm", folder)).edited("baseline")


# --- no quality bar, no distillation ---------------------------------------------------------------------
def test_without_an_accuracy_task_the_rung_is_skipped_saying_why(qwen, tmp_path):
    reason = forced_rung(folder_config(qwen, tmp_path)).check(CPU, champion(qwen))
    assert reason.startswith("no quality bar: accuracy.tasks is empty")
    assert "accuracy.tasks=[TASK]" in reason and "accuracy.include_path" in reason


@pytest.mark.parametrize("override, says, release", [
    ("ladder.rungs.distillation.force=true", "is forced (force: true)", "set ladder.rungs.distillation.force=false"),
    ("ladder.required=[distillation]", "is required (ladder.required)", "drop 'distillation' from ladder.required"),
])
def test_forced_or_required_without_a_task_is_refused_before_any_work(qwen, tmp_path, override, says, release):
    with pytest.raises(ConfigError) as err:
        validate(folder_config(qwen, tmp_path, override), CPU)
    message = str(err.value)
    assert f"rung 'distillation' {says}, but no quality bar: accuracy.tasks is empty" in message
    assert "accuracy.tasks=[TASK]" in err.value.fix and release in err.value.fix
    assert "\n" not in message
    with pytest.raises(ConfigError, match="is forced"):   # the built-in target too, when its task is taken away
        validate(compose([f"data_dir={tmp_path / 'data'}", "accuracy=none", "ladder.rungs.distillation.force=true"]),
                 CPU)


def test_with_a_task_a_forced_or_required_rung_passes_validation(qwen, tmp_path):
    tasks = task_folder(tmp_path / "tasks")
    for override in ("ladder.rungs.distillation.force=true", "ladder.required=[distillation]"):
        rungs = dict(validate(folder_config(qwen, tmp_path, override, "accuracy.tasks=[own_qa]",
                                            f"accuracy.include_path={tasks}"), CPU))
        assert rungs["distillation"].config_check() is None
    # the built-in target keeps its task, and its student the stdlib's training split
    rungs = dict(validate(compose([f"data_dir={tmp_path / 'data'}", "ladder.rungs.distillation.force=true"]), CPU))
    assert rungs["distillation"].sources.tasks == ("tiny_llm_nextline",)
    assert rungs["distillation"].sources.stdlib_heldout_every == 8


# --- the student learns from the user's own text -----------------------------------------------------------
def test_the_student_learns_from_the_prompts_file_and_the_run_records_it(qwen, tmp_path):
    from transformers import AutoTokenizer

    tasks = task_folder(tmp_path / "tasks")
    lines = [{"prompt": "def bisect(a, x):\n    lo, hi = 0, len(a)\n"}, {"prompt": "import string\n", "max_tokens": 4},
             {"messages": [{"role": "user", "content": "Wrap this text, please."}]}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    opt = forced_rung(folder_config(qwen, tmp_path, f"target.workload.prompts={prompts}", "accuracy.tasks=[own_qa]",
                                    f"accuracy.include_path={tasks}"))
    assert opt.check(CPU, champion(qwen)) is None
    tok = AutoTokenizer.from_pretrained(qwen)
    chat = tok.apply_chat_template(lines[2]["messages"], add_generation_prompt=True, tokenize=False)
    assert opt.training.texts == (lines[0]["prompt"], lines[1]["prompt"], chat)
    assert opt.training.source == f"prompts file {prompts}" and str(prompts) in opt.decision
    student = opt.apply(champion(qwen))
    assert json.loads((student.target.model_dir / "config.json").read_text())["num_hidden_layers"] == 1
    tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in opt.training.texts)   # + EOS each
    assert opt.applied() == {"distillation/data_source": f"prompts file {prompts}", "distillation/train_texts": "3",
                             "distillation/train_tokens": str(tokens)}


def test_the_student_learns_from_the_corpus(qwen, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("first text of mine\n")
    (corpus / "b.txt").write_text("second text of mine\n")
    tasks = task_folder(tmp_path / "tasks")
    opt = forced_rung(folder_config(qwen, tmp_path, f"target.workload.corpus={corpus}", "accuracy.tasks=[own_qa]",
                                    f"accuracy.include_path={tasks}"))
    assert opt.check(CPU, champion(qwen)) is None
    assert opt.training.source == f"corpus {corpus}"
    assert opt.training.texts == ("first text of mine\n", "second text of mine\n")


def test_without_prompts_or_corpus_the_student_learns_from_the_documents_the_gate_does_not_score(qwen, tmp_path):
    tasks = task_folder(tmp_path / "tasks")
    opt = forced_rung(folder_config(qwen, tmp_path, "accuracy.tasks=[own_qa]", f"accuracy.include_path={tasks}"))
    assert opt.check(CPU, champion(qwen)) is None
    assert opt.training.texts == tuple(f"train question {i}: {'yes' if i % 2 == 0 else 'no'}" for i in range(6))
    assert "6 train-split documents of own_qa" in opt.training.source and "does not score" in opt.training.source


def test_a_task_whose_every_document_is_scored_leaves_nothing_to_train_on(qwen, tmp_path):
    tasks = task_folder(tmp_path / "tasks", training_split="null")
    opt = forced_rung(folder_config(qwen, tmp_path, "accuracy.tasks=[own_qa]", f"accuracy.include_path={tasks}"))
    reason = opt.check(CPU, champion(qwen))
    assert "every document of own_qa is one the gate scores" in reason and "target.workload.prompts" in reason
    opt = forced_rung(folder_config(qwen, tmp_path, "accuracy.tasks=[own_qa]", f"accuracy.include_path={tasks}",
                                    "accuracy.limit=3"))
    assert opt.check(CPU, champion(qwen)) is None     # the gate scores the first 3 of the 5 test documents
    assert opt.training.texts == ("test question 3: no", "test question 4: yes")
    assert "2 test-split past accuracy.limit=3 documents of own_qa" in opt.training.source


def test_the_sweep_records_the_rung_as_skipped_with_the_reason(qwen, tmp_path):
    """As the sweep climbs it: nothing built or trained, the verdict and reason on the rung's run."""
    from types import SimpleNamespace

    import mlflow

    from experiments.climb.rung import climb

    cfg = folder_config(qwen, tmp_path)
    opt = dict(load_rungs(cfg))["distillation"]
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        experiment = mlflow.create_experiment("distill-guard", artifact_location=(tmp_path / "artifacts").as_uri())
        base = SimpleNamespace(candidate=champion(qwen), run_id="baseline-run", bench=None)
        sweep = SimpleNamespace(cfg=cfg, env=CPU, experiment_id=experiment)
        outcome = climb("distillation", opt, base, sweep, SimpleNamespace(started=lambda *args: None), "key")
        tags = mlflow.get_run(outcome.run_id).data.tags
    finally:
        mlflow.set_tracking_uri(previous)
    assert outcome.verdict.status == "skipped"
    assert outcome.verdict.reason.startswith("not applicable here: no quality bar: accuracy.tasks is empty")
    assert tags["roi.verdict"] == "skipped" and "no quality bar" in tags["roi.reason"]
