"""A user's own lm-eval task and input, checked before any model is built (issue 34, items 1 and 4): the metric
the gate judges each task on, unknown tasks and bad prompts lines for a built-in target, and a measuring child's
failure told in the exception's own words."""
import json
from pathlib import Path

import pytest
from conftest import compose

from experiments.climb.validation import validate
from experiments.core.errors import ConfigError
from experiments.core.recipe import Env
from experiments.judge.accuracy import gated
from experiments.measure import isolation

CPU = Env(cuda=False, cuda_capability=None, cpu_count=2)
LIMITS = isolation.Limits(time_s=30, memory_bytes=3 * 2**30, poll_s=0.1)


def task_folder(folder: Path, name: str = "my_task", metrics=("acc",), output_type="multiple_choice") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text(json.dumps({"context": "x = ", "choices": ["1", "2"], "label": 0}) + "\n")
    listed = "".join(f"  - metric: {m}\n    aggregation: {agg}\n    higher_is_better: true\n"
                     for m, agg in ((m, "mean") if isinstance(m, str) else m for m in metrics))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        f"output_type: {output_type}\ndoc_to_text: \"{{{{context}}}}\"\ndoc_to_choice: \"{{{{choices}}}}\"\n"
        f"doc_to_target: \"{{{{label}}}}\"\nmetric_list:\n{listed}metadata:\n  version: 1.0\n")
    return folder


def builtin_sweep(tmp_path, *overrides):
    return compose([f"data_dir={tmp_path / 'data'}", *overrides])


def test_a_task_whose_only_metric_is_acc_is_gated_on_acc_when_no_metric_is_set(tmp_path):
    [g] = gated(["my_task"], task_folder(tmp_path / "tasks"), None)
    assert (g.metric, g.describe()) == ("acc", "my_task: acc (the task's first per-document metric; "
                                               "gate.accuracy.metric is not set)")
    assert compose().gate.accuracy.metric is None          # the default: each task's own


def test_the_first_per_document_metric_is_taken_past_a_corpus_level_one(tmp_path):
    folder = task_folder(tmp_path / "tasks", metrics=(("mcc", "matthews_corrcoef"), "acc_norm"))
    assert gated(["my_task"], folder, None)[0].metric == "acc_norm"


def test_a_metric_the_task_does_not_produce_is_refused_before_any_build_naming_the_task_and_its_metrics(tmp_path):
    cfg = builtin_sweep(tmp_path, "accuracy.tasks=[my_task]", f"accuracy.include_path={task_folder(tmp_path / 't')}",
                        "gate.accuracy.metric=acc_mutual_info")
    with pytest.raises(ConfigError) as err:
        validate(cfg, CPU)
    assert err.value.problem == ("gate.accuracy.metric=acc_mutual_info but lm-eval task 'my_task' does not produce "
                                 "it (its metrics: acc; per document: acc)")
    assert "null for each task's first" in err.value.fix
    assert not (tmp_path / "data" / "cache").exists()      # refused before the built-in model's build


def test_a_task_with_no_per_document_metric_is_refused(tmp_path):
    folder = task_folder(tmp_path / "tasks", metrics=(("mcc", "matthews_corrcoef"),))
    with pytest.raises(ConfigError, match=r"lm-eval task 'my_task' has no per-document metric the gate can pair "
                                          r"\(its metrics: mcc\)"):
        gated(["my_task"], folder, None)


def test_an_unknown_task_for_a_builtin_target_is_refused_before_its_build(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown lm-eval task\(s\): tiny_llm_nextlin .*did you mean "
                                          r"'tiny_llm_nextline'") as err:
        validate(builtin_sweep(tmp_path, "accuracy.tasks=[tiny_llm_nextlin]"), CPU)
    assert "tiny_llm_nextlin" in str(err.value)
    assert not (tmp_path / "data" / "cache").exists()


def test_the_builtin_targets_shipped_tasks_pass_validation_unbuilt(tmp_path):
    validate(builtin_sweep(tmp_path), CPU)
    validate(builtin_sweep(tmp_path, "target=smollm2"), CPU)
    assert not (tmp_path / "data" / "cache").exists()


def test_a_bad_prompts_line_for_a_builtin_target_is_refused_before_its_build(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f():"}\n{"prompt": "x", "max_tokens": 0}\n')
    with pytest.raises(ConfigError, match=r"prompts.jsonl line 2: max_tokens 0 is not an integer >= 1"):
        validate(builtin_sweep(tmp_path, f"target.workload.prompts={prompts}"), CPU)
    prompts.write_text('{"prompt": "def f():"}\n{"prompt": "x"\n')
    with pytest.raises(ConfigError, match=r"prompts.jsonl line 2 is not valid JSON"):
        validate(builtin_sweep(tmp_path, f"target.workload.prompts={prompts}"), CPU)
    assert not (tmp_path / "data" / "cache").exists()


def _score(metric):
    per_doc = {"acc": 1.0}
    return per_doc[metric]       # KeyError, raised deep in a measuring child


def test_a_measuring_childs_failure_is_the_exceptions_own_words_not_its_traceback(tmp_path):
    out = isolation.run(_score, ("acc_mutual_info",), LIMITS, tmp_path / "child.log")
    assert out.value is None
    assert out.failure == f"KeyError: 'acc_mutual_info' (traceback in {tmp_path / 'child.log'})"
    assert "Traceback" in (tmp_path / "child.log").read_text()       # kept where the reason points
