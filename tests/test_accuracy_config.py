"""Accuracy configuration: tasks by name or from a local folder, tolerances that parse, the paired z-test."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import compose
from omegaconf import OmegaConf

from experiments.core.errors import ConfigError
from experiments.judge.accuracy import AccuracyReport, check_tasks, evaluate
from experiments.judge.gate import Gate, check_config

SHIPPED_TASK = Path(__file__).resolve().parents[1] / "experiments" / "targets" / "models" / "tasks" / "tiny_llm_nextline.yaml"
Z95 = 1.6448536269514722          # one-sided 95 % normal quantile


def gate(max_drop_abs=0.02, max_drop_rel=None, confidence=0.95):
    return Gate(OmegaConf.create({"confidence": confidence, "accuracy": {
        "metric": "acc", "max_drop_abs": max_drop_abs, "max_drop_rel": max_drop_rel}}))


def report(per_doc):
    per_doc = np.asarray(per_doc, float)
    return AccuracyReport("t", "acc", float(per_doc.mean()), 0.0, tuple(per_doc))


def lose(k, n=400, champion_right=None):
    """Champion right on `champion_right` docs (default all); challenger also wrong on the first k of them."""
    right = n if champion_right is None else champion_right
    champion = [1.0] * right + [0.0] * (n - right)
    return report(champion), report([0.0] * k + champion[k:])


# --- tasks ------------------------------------------------------------------------------------------------
def local_task(folder: Path, name: str, docs: list[dict]) -> Path:
    """A copy of the shipped task under another name, over `docs` written next to it."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    text = SHIPPED_TASK.read_text().replace("task: tiny_llm_nextline", f"task: {name}")
    (folder / f"{name}.yaml").write_text(text.replace("@DATA@", str(data)))
    return folder


def test_a_builtin_lm_eval_task_is_accepted_by_name():
    check_tasks(["hellaswag"], None)


def test_an_unknown_task_is_refused_naming_it_and_where_it_was_looked_for(tmp_path):
    folder = local_task(tmp_path / "tasks", "my_nextline", [])
    with pytest.raises(ConfigError) as err:
        check_tasks(["hellaswag", "my_nextline", "hellaswagg_nope"], folder)
    assert "hellaswagg_nope" in err.value.problem and "hellaswag," not in err.value.problem
    assert str(folder) in err.value.problem
    assert "did you mean 'hellaswag" in err.value.fix and "include_path" in err.value.fix


def test_a_missing_include_path_is_refused_before_any_indexing(tmp_path):
    with pytest.raises(ConfigError, match="not a folder") as err:
        check_tasks(["tiny_llm_nextline"], tmp_path / "no-such-folder")
    assert "no-such-folder" in err.value.problem


def test_a_local_task_folder_is_found_and_scored_via_include_path(tmp_path, model_dir):
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments.targets.models.tiny_llm import task_dir

    shipped = (task_dir(model_dir) / "tiny_llm_nextline.jsonl").read_text().splitlines()
    folder = local_task(tmp_path / "tasks", "my_nextline", [json.loads(line) for line in shipped[:12]])
    check_tasks(["my_nextline"], folder)
    lm = HFLM(pretrained=AutoModelForCausalLM.from_pretrained(model_dir), batch_size=8, device="cpu",
              tokenizer=AutoTokenizer.from_pretrained(model_dir))
    seen = []
    [rep] = evaluate(lm, ["my_nextline"], "acc_mutual_info", folder, None, 0,
                     progress=lambda done, total=None, what=None, unit=None: seen.append((done, total, what)))
    assert rep.task == "my_nextline" and len(rep.per_doc) == 12 and set(rep.per_doc) <= {0.0, 1.0}
    total = seen[0][1]                   # lm-eval's progress: every request answered is counted, up to the total
    assert seen[0] == (0, total, "loglikelihood") and total >= 48
    assert [done for done, _, _ in seen[1:]] == list(range(1, total + 1))
    assert rep.value == pytest.approx(np.mean(rep.per_doc))


# --- gate configuration -----------------------------------------------------------------------------------
@pytest.mark.parametrize("override, words", [
    # types and ranges: the settings table's words (experiments/core/settings.py), as the sweep's validation says them
    ("gate.accuracy.max_drop_abs=abc", "max_drop_abs='abc' is not a number (or null) >= 0"),
    ("gate.accuracy.max_drop_rel=five", "max_drop_rel='five' is not a number (or null) in [0, 1]"),
    ("gate.accuracy.max_drop_abs=-0.01", "max_drop_abs=-0.01 is not a number (or null) >= 0"),
    ("gate.accuracy.max_drop_rel=5", "max_drop_rel=5 is not a number (or null) in [0, 1]"),
    ("gate.accuracy.max_drop_abs=null", "no tolerance"),
    ("gate.confidence=1.5", "gate.confidence=1.5 is not a number in (0, 1)"),
    ("gate.confidence=0", "gate.confidence=0 is not a number in (0, 1)"),
    ("gate.confidence=high", "gate.confidence='high' is not a number in (0, 1)"),
    ("gate.accuracy.metric='acc,none'", "without a filter suffix"),
])
def test_bad_gate_config_is_refused_with_what_to_do(override, words):
    cfg = compose([override])
    with pytest.raises(ConfigError) as err:
        check_config(cfg.gate)
    assert words in str(err.value)


def test_the_shipped_gate_config_passes_and_the_ladder_validates_it(tmp_path):
    from experiments.climb.validation import validate

    check_config(compose().gate)
    check_config(compose(["gate.accuracy.max_drop_rel=0.05"]).gate)
    with pytest.raises(ConfigError, match="max_drop_abs"):
        validate(compose([f"data_dir={tmp_path}", "gate.accuracy.max_drop_abs=abc"]))


# --- the paired z-test, known answers ---------------------------------------------------------------------
def test_drop_se_and_upper_bound_match_the_binomial_formulas():
    # Challenger loses 4 of 400 documents: per-doc differences are 0/1 with p = 0.01, so
    # se = sqrt(p (1 - p) / (n - 1)) (sample sd, ddof=1, over sqrt(n)).
    crit = gate().accuracy(*lose(4))
    se = math.sqrt(0.01 * 0.99 / 399)
    assert crit.numbers["drop"] == pytest.approx(0.01)
    assert crit.numbers["drop_se"] == pytest.approx(se) == pytest.approx(0.00498117, rel=1e-5)
    assert crit.numbers["drop_upper"] == pytest.approx(0.01 + Z95 * se) == pytest.approx(0.0181933, rel=1e-5)
    assert crit.numbers["z"] == pytest.approx((0.02 - 0.01) / se) == pytest.approx(2.00756, rel=1e-5)
    assert crit.numbers["z_needed"] == pytest.approx(Z95)
    assert crit.passed and crit.numbers["tolerance"] == 0.02


def test_a_drop_below_the_tolerance_still_fails_when_not_significantly_below():
    crit = gate().accuracy(*lose(6))               # 1.5 points: upper 0.015 + 1.645 * 0.00609 = 0.0250
    assert not crit.passed
    assert crit.numbers["drop_upper"] == pytest.approx(0.0250093, rel=1e-5)
    assert crit.numbers["z"] == pytest.approx(0.821661, rel=1e-5)
    assert gate(confidence=0.90).accuracy(*lose(6)).numbers["drop_upper"] == pytest.approx(
        0.015 + 1.2815516 * math.sqrt(0.015 * 0.985 / 399))


def test_gains_and_losses_are_paired_per_document():
    # 12 documents lost, 4 gained: drop 8/400 = 0.02; sum of squares 16, so var = (16 - 400 * 0.02^2) / 399.
    champion = report([1.0] * 12 + [0.0] * 4 + [1.0] * 384)
    challenger = report([0.0] * 12 + [1.0] * 4 + [1.0] * 384)
    crit = gate(max_drop_abs=0.05).accuracy(champion, challenger)
    se = math.sqrt((16 - 400 * 0.02**2) / 399 / 400)
    assert crit.numbers["drop"] == pytest.approx(0.02) and crit.numbers["drop_se"] == pytest.approx(se)
    assert crit.passed == (0.02 + Z95 * se <= 0.05)


def test_relative_tolerance_is_a_share_of_the_champion_and_the_stricter_applies():
    champion, challenger = lose(2, champion_right=160)             # champion 0.40, drop 0.005
    only_rel = gate(max_drop_abs=None, max_drop_rel=0.05).accuracy(champion, challenger)
    assert only_rel.numbers["tolerance"] == pytest.approx(0.05 * 0.40)
    assert "max_drop_rel 0.05 x 0.400" in only_rel.detail
    both = gate(max_drop_abs=0.02, max_drop_rel=0.025).accuracy(champion, challenger)
    assert both.numbers["tolerance"] == pytest.approx(0.01)                       # 2.5 % of 0.40 < 0.02
    assert gate(max_drop_abs=0.02).accuracy(champion, challenger).passed          # upper 0.0108 <= 0.02
    assert not both.passed                                                        # upper 0.0108 > 0.01
    loose = gate(max_drop_abs=0.02, max_drop_rel=0.5).accuracy(champion, challenger)
    assert loose.numbers["tolerance"] == 0.02                                     # absolute is stricter here


def test_identical_answers_pass_with_no_spread():
    champion = report([1.0, 0.0] * 100)
    crit = gate(max_drop_abs=0.0).accuracy(champion, champion)
    assert crit.passed and crit.numbers["drop_se"] == 0.0 and crit.numbers["z"] == math.inf


def test_a_task_too_small_to_decide_says_so_instead_of_a_drop():
    # issue 34: 40 documents, one answer lost and one gained: drop 0, se 0.035, upper +0.058 > 0.02. No drop is
    # shown, and none within the tolerance could be on 40 documents: undecided, with the documents it would need.
    champion = report([1.0, 0.0] + [1.0] * 38)
    crit = gate().accuracy(champion, report([0.0, 1.0] + [1.0] * 38))
    assert not crit.passed and crit.numbers["drop"] == 0.0
    needed = math.ceil((Z95 * math.sqrt(2 / 39) / 0.02) ** 2)                   # (z sd / tol)^2 = 347
    assert crit.numbers["documents_needed"] == needed == 347
    assert crit.detail.startswith(f"undecided: the task is too small to show a drop within the tolerance (it would "
                                  f"need about {needed} documents); t acc ")
    # a drop the documents do show beyond the tolerance stays a drop
    shown = gate().accuracy(*lose(40, n=400))                                     # 10 points, se 0.015
    assert not shown.passed and not shown.detail.startswith("undecided") and "documents_needed" not in shown.numbers
    # ...and a drop below it but not significantly (lose(6) above) is undecided: more documents could show it
    assert gate().accuracy(*lose(6)).detail.startswith("undecided")
