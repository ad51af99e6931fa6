"""The MLflow UI in a real browser: a quick sweep into a scratch `mlflow server`, its runs table read from
headless Chromium's DOM (slow; skipped where Chromium is not installed). Also what the sweep's diagnosis left."""
import pytest
from conftest import SHARED_CACHE
from mlflow.tracking import MlflowClient

from experiments.tools.ui_check import find_chromium, run_check, runs_table

DOM = """<div role="row" row-id="tag.roi.kind.rung.abc"><div col-id="attributes.`Run Name`"><a><span>baseline</span>
</a></div></div><div role="row" row-id="tag.roi.kind.rung.abc"><div col-id="tags.`roi.verdict`"><span>accepted</span>
</div><img src="x"><div col-id="tags.`roi.rung`">baseline</div></div>
<div role="row" row-id="tag.roi.kind.sweep.def"><div col-id="attributes.`Run Name`">#1f272d<span>sweep-1</span></div>
<div col-id="tags.`roi.verdict`">-</div></div>"""


def test_runs_table_joins_the_name_and_verdict_cells_of_a_row():
    assert runs_table(DOM) == {"baseline": "accepted", "sweep-1": "-"}


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="Chromium is not installed (apt-get install -y chromium); "
                                                     "the browser check of the MLflow UI cannot run here")
def test_the_runs_table_shows_every_rung_and_its_verdict(model_dir, tmp_path):
    # what is read is the UI, not the measurements: the plumbing profile's one level, 20 documents, no rounds
    result = run_check(tmp_path, find_chromium(), "engine-swap", SHARED_CACHE, profile="plumbing")
    print(result.to_text())
    assert set(result.expected) == {"baseline", "onnxruntime"}
    assert result.ok, result.to_text()
    # the pages a reviewer lands on: the runs view (not the GenAI dashboard), the sweep's description, the report
    assert result.experiment_kind == "custom_model_development"
    assert [p.name for p in result.pages] == ["experiment (runs view)", "sweep run description", "report.html"]
    assert all(not p.missing and p.screenshot.stat().st_size > 10_000 for p in result.pages), result.to_text()
    # The same sweep's diagnosis: on each measured rung and, with the decode-step profile, on the sweep's run.
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments() if e.name.startswith("roi")])
    rungs = [r for r in runs if r.data.tags.get("roi.kind") == "rung"]
    parent = next(r for r in runs if r.data.tags.get("roi.kind") == "sweep")
    for run in rungs + [parent]:
        assert run.data.tags["roi.diagnosis"].split(":")[0] in {
            "queueing", "saturation", "memory_bound", "overhead", "compute_bound", "model", "outside_engine",
            "cpu_side", "memory_capacity"}
        assert run.data.tags["roi.recommended_next_rung"] and run.data.tags["roi.recommended_next_rung.reason"]
    # at the plumbing profile's one level, c=1
    assert "diagnosis/queue_share_c1" in parent.data.metrics and "profile/decode_step_ms" in parent.data.metrics
    assert "roi.diagnosis.framework_profile" not in parent.data.tags          # the profiler did not fail
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "ui-check")} == {
        "ui-check/ladder.png", "ui-check/experiment.png", "ui-check/sweep.png", "ui-check/report.png"}
    profile = client.download_artifacts(parent.info.run_id, "diagnosis/framework_profile.md", str(tmp_path))
    assert "self ms per step" in open(profile).read()
