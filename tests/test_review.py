"""What a reviewer reads in the UI: the sweep's and each rung's description, the HTML report, the URLs."""
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from experiments.judge.gate import Criterion, Verdict
from experiments.record.outcome import RungOutcome
from experiments.record.review import html_report, rung_description, sweep_description
from experiments.record.ui import experiment_url, run_url, ui_base


def _ladder():
    base = RungOutcome("baseline", Verdict("accepted", "baseline: the first champion"), run_id="r0")
    slower = RungOutcome("torch_compile", Verdict("rejected", "ratio 1.3 [1.2, 1.4]", (
        Criterion("performance", False, "ratio 1.3 [1.2, 1.4] >= 0.95 needed"),
        Criterion("accuracy", True, "drop 0.00 within 0.02"))), run_id="r1", champion_before=base)
    return [base, slower], base


def test_the_sweep_description_has_the_table_the_champion_and_what_to_do_next():
    outcomes, champion = _ladder()
    text = sweep_description(outcomes, champion, 8, "tiny-llm")
    assert "**Champion: `baseline`** (run `r0`)" in text and "1 accepted, 1 rejected" in text
    assert "| torch_compile | rejected |" in text and "make promote RUN=r0 target=tiny-llm" in text
    assert "make rollback target=tiny-llm" in text
    assert "No champion" in sweep_description(outcomes[:1], None, 8, "tiny-llm")


def test_a_rungs_description_has_its_verdict_every_criterion_and_its_champion():
    outcomes, _ = _ladder()
    text = rung_description(outcomes[1])
    assert text.startswith("**rejected**: ratio 1.3")
    assert "| performance | **FAIL** | ratio 1.3 [1.2, 1.4] >= 0.95 needed |" in text
    assert "| accuracy | pass |" in text and "champion `baseline` (run `r0`)" in text


def test_the_html_report_holds_the_table_and_the_plots():
    outcomes, _ = _ladder()
    fig = Figure()
    fig.add_subplot().plot([1, 2], [3, 4])
    page = html_report("ROI ladder <tiny>", outcomes, 8, {"plots/waterfall.png": fig})
    assert "<title>ROI ladder &lt;tiny&gt;</title>" in page
    assert "<tr class=rejected><td>torch_compile</td><td>rejected</td>" in page and "<td>baseline</td><td>ratio" in page
    assert page.count("data:image/png;base64,iVBOR") == 1          # a real PNG, inline


def test_urls_open_the_runs_view_not_the_genai_dashboard():
    local = OmegaConf.create({"uri": "sqlite:////x/mlflow.db", "ui_host": "127.0.0.1", "ui_port": 5000})
    assert experiment_url(ui_base(local), "3") == "http://127.0.0.1:5000/#/experiments/3?workflowType=machine_learning"
    server = OmegaConf.create({"uri": "https://u:secret@mlflow.internal/", "ui_host": "x", "ui_port": 1})
    url = run_url(ui_base(server), "3", "abc")
    assert url.endswith("/#/experiments/3/runs/abc?workflowType=machine_learning") and "secret" not in url
