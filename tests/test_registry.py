"""Promotion and rollback through the MLflow model registry, on a real sqlite store under tmp_path."""
import multiprocessing
from pathlib import Path

import mlflow
import pytest
from conftest import SHARED_CACHE, compose
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf, open_dict

from experiments.core.errors import ConfigError
from experiments.core.recipe import Candidate, Recipe, Target
from experiments.record import packaged, registry, tracking
from optimizers.baseline import EagerBaseline
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.quantization import WeightQuantization

NAME = "roi-ladder-tiny-llm"
BASE = EagerBaseline().apply(Candidate(Target("tiny-llm", "causal-lm", Path("unused"))))
ORT = OnnxRuntimeSwap().apply(BASE)


@pytest.fixture
def cfg(tmp_path):
    """The composed config of a sweep whose data dir is tmp_path (models still come from the shared cache)."""
    cfg = compose([f"data_dir={tmp_path}", f"cache_dir={SHARED_CACHE}"])
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def log_sweep(cfg, rungs: list[tuple[str, str, Candidate, float]]) -> dict[str, str]:
    """A sweep as `roi-ladder sweep` logs it: parent + one child per (rung, verdict, candidate, e2e p50)."""
    experiment_id = tracking.connect(cfg.tracking)
    ids, champion = {}, ""
    with tracking.run("sweep-test", experiment_id, tags={"roi.kind": "sweep", "roi.target": "tiny-llm"}) as parent:
        tracking.log_params(tracking.flatten(OmegaConf.to_container(cfg, resolve=True)))
        mlflow.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config/resolved.yaml")
        for rung, verdict, cand, e2e in rungs:
            tags = {"roi.kind": "rung", "roi.rung": rung, "roi.verdict": verdict, "roi.reason": f"{rung} {verdict}"}
            with tracking.run(rung, experiment_id, nested=True, tags=tags) as child:
                mlflow.log_params(tracking.flatten({"recipe": cand.describe()}))
                for step, factor in ((1, 1.0), (2, 1.5)):
                    mlflow.log_metrics({"e2e_ms_p50": e2e * factor, "output_tokens_per_s": 1000 / e2e}, step=step)
                mlflow.log_metrics({"tpot_ms_p50": e2e / 20, "accuracy/tiny_llm_nextline/acc_mutual_info": 0.37,
                                    "accuracy/tiny_llm_nextline/acc_mutual_info_stderr": 0.02})
            ids[rung] = child.info.run_id
            champion = child.info.run_id if verdict == "accepted" else champion
        mlflow.set_tag("roi.champion_run", champion)
    ids["sweep"] = parent.info.run_id
    return ids


@pytest.fixture
def sweep(cfg):
    return log_sweep(cfg, [("baseline", "accepted", BASE, 60.0), ("onnxruntime", "accepted", ORT, 5.0),
                           ("int8", "rejected", WeightQuantization("int8").apply(ORT), 6.0)])


def version(name, v):
    return MlflowClient().get_model_version(name, v)


def champion(name=NAME):
    return str(MlflowClient().get_registered_model(name).aliases.get("champion"))


def test_promote_registers_the_run_sets_champion_and_tags(cfg, sweep, tmp_path):
    result = registry.promote(cfg.tracking, sweep["baseline"], None)
    assert (result.model_name, result.version, result.rollback_to) == (NAME, "1", "")
    assert champion() == "1"
    mv = version(NAME, "1")
    assert mv.source.startswith("models:/m-") and mv.run_id == sweep["baseline"]
    assert mv.tags["rollback_to"] == "" and mv.tags["source_run"] == sweep["baseline"]
    assert mv.tags["rung"] == "baseline" and mv.tags["verdict"] == "baseline accepted"
    assert float(mv.tags["e2e_ms_p50"]) == 90.0                     # the run's latest value (step 2)
    assert float(mv.tags["tpot_ms_p50"]) == 3.0 and float(mv.tags["output_tokens_per_s"]) > 0
    assert float(mv.tags["accuracy/tiny_llm_nextline/acc_mutual_info"]) == pytest.approx(0.37)
    assert MlflowClient().get_run(sweep["baseline"]).data.tags["roi.promoted_version"] == f"{NAME}/1"
    assert (tmp_path / "registry.lock").exists()


def test_the_package_holds_the_recipe_and_the_config(cfg, sweep):
    import json

    registry.promote(cfg.tracking, sweep["onnxruntime"], None)
    folder = Path(mlflow.artifacts.download_artifacts(f"models:/{NAME}@champion"))
    recipe = json.loads(next(folder.rglob("recipe.json")).read_text())
    assert Recipe(**recipe["recipe"]) == ORT.recipe and recipe["recipe"]["engine"] == "onnxruntime"
    assert recipe["rungs"] == ["baseline", "onnxruntime"]
    assert recipe["target"]["source"] == "builtin:tiny-llm" and recipe["target"]["build"]["hidden_size"] == 192
    assert "target:" in next(folder.rglob("resolved.yaml")).read_text()


def test_recipe_params_come_back_typed_and_missing_fields_take_their_defaults():
    params = tracking.flatten({"recipe": WeightQuantization("int8").apply(ORT).describe()})
    assert Recipe(**registry.recipe_from_params(params)) == WeightQuantization("int8").apply(ORT).recipe
    assert Recipe(**registry.recipe_from_params({"recipe.engine": "onnxruntime"})) == Recipe(engine="onnxruntime")
    with pytest.raises(ConfigError, match="no recipe"):
        registry.recipe_from_params({"target.name": "tiny-llm"}, "r1")


def test_second_promotion_points_back_at_the_first(cfg, sweep):
    registry.promote(cfg.tracking, sweep["baseline"], None)
    second = registry.promote(cfg.tracking, sweep["onnxruntime"], None)
    assert (second.version, second.rollback_to) == ("2", "1")
    assert champion() == "2" and version(NAME, "2").tags["rollback_to"] == "1"


def test_rollback_moves_champion_back_and_records_who_when_why(cfg, sweep):
    registry.promote(cfg.tracking, sweep["baseline"], None)
    registry.promote(cfg.tracking, sweep["onnxruntime"], None)
    result = registry.rollback(cfg.tracking, None, None, "p99 regression in canary")
    assert (result.from_version, result.to_version) == ("2", "1")
    assert champion() == "1"
    rolled = version(NAME, "2").tags
    assert rolled["rolled_back_reason"] == "p99 regression in canary" and rolled["rolled_back_by"]
    assert rolled["rolled_back_at"].endswith("+00:00")
    assert version(NAME, "1").tags["restored_at"] and version(NAME, "1").tags["restored_from"] == "2"


def test_rollback_twice_walks_further_back(cfg, sweep):
    for rung in ("baseline", "onnxruntime", "baseline"):
        registry.promote(cfg.tracking, sweep[rung], None)
    registry.rollback(cfg.tracking, NAME, None, "first")
    registry.rollback(cfg.tracking, NAME, None, "second")
    assert champion() == "1"
    with pytest.raises(ConfigError, match="first champion"):
        registry.rollback(cfg.tracking, NAME, None, "third")


def test_rollback_to_an_explicit_version(cfg, sweep):
    for rung in ("baseline", "onnxruntime", "baseline"):
        registry.promote(cfg.tracking, sweep[rung], None)
    assert registry.rollback(cfg.tracking, NAME, "1", "skip v2").to_version == "1"
    assert champion() == "1"
    with pytest.raises(ConfigError, match="no version '9'"):
        registry.rollback(cfg.tracking, NAME, "9", "")


def test_rollback_without_history_is_refused_clearly(cfg, sweep):
    with pytest.raises(ConfigError, match="no version with alias 'champion'"):
        registry.rollback(cfg.tracking, NAME, None, "")
    registry.promote(cfg.tracking, sweep["baseline"], None)
    with pytest.raises(ConfigError, match="no earlier version to roll back to") as err:
        registry.rollback(cfg.tracking, NAME, None, "")
    assert "--to VERSION" in err.value.fix
    assert champion() == "1"


def test_promote_refuses_rejected_unknown_and_non_rung_runs(cfg, sweep):
    with pytest.raises(ConfigError, match="was rejected, not accepted"):
        registry.promote(cfg.tracking, sweep["int8"], None)
    with pytest.raises(ConfigError, match="does not exist"):
        registry.promote(cfg.tracking, "0123456789abcdef0123456789abcdef", None)
    with pytest.raises(ConfigError, match="is not a rung run"):
        registry.promote(cfg.tracking, sweep["sweep"], None)
    live = MlflowClient().create_run(MlflowClient().get_run(sweep["sweep"]).info.experiment_id, tags={
        "roi.kind": "rung", "roi.verdict": "accepted", "mlflow.parentRunId": sweep["sweep"]})
    with pytest.raises(ConfigError, match="is RUNNING"):
        registry.promote(cfg.tracking, live.info.run_id, None)
    assert not MlflowClient().search_registered_models()


def test_promote_without_a_sweep_is_refused(cfg):
    with pytest.raises(ConfigError, match="no finished sweep") as err:
        registry.promote(cfg.tracking, None, None)
    assert "make sweep" in err.value.fix


def test_default_run_is_the_latest_sweeps_champion(cfg, sweep):
    newer = log_sweep(cfg, [("baseline", "accepted", BASE, 50.0), ("onnxruntime", "rejected", ORT, 55.0)])
    result = registry.promote(cfg.tracking, None, None)
    assert result.run_id == newer["baseline"] != sweep["baseline"]


def test_without_a_target_the_commands_act_on_the_stores_latest_sweep_whatever_its_target(cfg, sweep, tmp_path):
    """`make sweep target=smollm2`, then `make promote` (no target=): that sweep's champion, registered as
    roi-ladder-smollm2, not a search in roi-ladder/tiny-llm; target=... still chooses."""
    from experiments.cli import on_the_latest_sweep

    other = compose([f"data_dir={tmp_path}", f"cache_dir={SHARED_CACHE}", "target=smollm2"])
    with open_dict(other):
        del other["hydra"]
    newer = log_sweep(other, [("baseline", "accepted", BASE, 50.0)])
    assert tracking.latest_sweep_experiment(cfg.tracking) == "roi-ladder/smollm2"
    chosen = on_the_latest_sweep(cfg.copy(), [f"data_dir={tmp_path}"])
    assert chosen.tracking.experiment == "roi-ladder/smollm2"
    result = registry.promote(chosen.tracking, None, None)
    assert result.run_id == newer["baseline"] and result.model_name == "roi-ladder-smollm2"
    assert registry.status(chosen.tracking)[0]["version"] == "1"
    kept = on_the_latest_sweep(cfg.copy(), ["target=tiny-llm"])
    assert kept.tracking.experiment == "roi-ladder/tiny-llm"
    assert registry.promote(kept.tracking, None, None).run_id == sweep["onnxruntime"]


def test_model_name_is_configurable(cfg, sweep):
    result = registry.promote(cfg.tracking, sweep["baseline"], "serving-llm")
    assert result.model_name == "serving-llm" and champion("serving-llm") == "1"
    assert registry.status(cfg.tracking, "serving-llm")[0]["version"] == "1"


def _promote_at_once(tracking_cfg, run_id, barrier, results):
    barrier.wait()
    results.put(registry.promote(tracking_cfg, run_id, None))


def test_two_promotions_at_once_leave_one_champion_and_a_valid_chain(cfg, sweep):
    registry.promote(cfg.tracking, sweep["baseline"], None)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_promote_at_once, args=(cfg.tracking, sweep[rung], barrier, results))
             for rung in ("baseline", "onnxruntime")]
    for p in procs:
        p.start()
    done = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert all(p.exitcode == 0 for p in procs)
    first, second = sorted(done, key=lambda r: int(r.version))
    assert (first.version, second.version) == ("2", "3")
    assert champion() == "3"
    assert first.rollback_to == "1" and second.rollback_to == "2"     # not both "1": the lock serialized them
    assert [e["version"] for e in registry.status(cfg.tracking, NAME)] == ["3", "2", "1"]


def test_status_lists_the_chain_from_the_champion_back(cfg, sweep):
    registry.promote(cfg.tracking, sweep["baseline"], None)
    registry.promote(cfg.tracking, sweep["onnxruntime"], None)
    chain = registry.status(cfg.tracking, None)
    assert [(e["version"], e["champion"], e["rung"]) for e in chain] == [("2", True, "onnxruntime"),
                                                                         ("1", False, "baseline")]
    assert chain[0]["source_run"] == sweep["onnxruntime"] and chain[0]["rollback_to"] == "1"
    assert chain[0]["metrics"]["e2e_ms_p50"] == 7.5 and chain[0]["created"].endswith("+00:00")
    assert chain[0]["verdict"] == "onnxruntime accepted"
    text = registry.format_chain(NAME, chain)
    assert "champion v2" in text and "v1" in text and sweep["baseline"] in text and "e2e_ms_p50=7.5" in text
    registry.rollback(cfg.tracking, NAME, None, "test")
    assert [(e["version"], e["champion"]) for e in registry.status(cfg.tracking, NAME)] == [("1", True)]


def test_status_of_an_unregistered_model_is_refused(cfg, sweep):
    with pytest.raises(ConfigError, match="no model named"):
        registry.status(cfg.tracking, NAME)


@pytest.mark.slow
def test_champion_loads_as_pyfunc_and_continues_prompts_like_the_engine(cfg, sweep, tiny_target):
    import pandas as pd

    from experiments.serving import build_engine

    registry.promote(cfg.tracking, sweep["baseline"], None)
    # what the version records names no folder of this machine: where it loads, it finds its own cache
    # (read from its MLmodel file: loading it here would build the model into this folder's .roi/cache)
    assert mlflow.models.get_model_info(f"models:/{NAME}@champion").flavors["python_function"]["config"] == \
        {"cache_dir": None, "threads": 2}
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion", model_config={"cache_dir": str(SHARED_CACHE)})
    prompts = ["def __init__(self, name):\n", "import os\nimport sys\n\n"]
    out = model.predict(prompts, params={"max_new_tokens": 12})
    assert len(out) == 2 and all(isinstance(text, str) and text for text in out)
    assert model.predict(pd.DataFrame({"prompt": prompts}), params={"max_new_tokens": 12}) == out
    engine = build_engine(EagerBaseline().apply(Candidate(tiny_target)), 2, SHARED_CACHE / "artefacts")
    tok = engine.tokenizer
    for prompt, text in zip(prompts, out):
        ids = [t for t, _ in engine.generate(tok.encode(prompt, add_special_tokens=False), 12)]
        ids = ids[:ids.index(tok.eos_token_id)] if tok.eos_token_id in ids else ids
        assert text == tok.decode(ids, skip_special_tokens=True)


def test_a_built_in_other_than_tiny_llm_or_a_gguf_is_found_again_at_load(tmp_path):
    # promote packaged target.build, which only tiny-llm has, and load looked for builtin:smollm2-135m as a folder
    cfg = compose(["target=smollm2", f"data_dir={tmp_path}"])

    class Run:
        data = type("Data", (), {"params": {"recipe.engine": "onnxruntime", "recipe.rungs.0": "baseline"}})
        info = type("Info", (), {"run_id": "r"})

    package = registry.package_recipe(Run, cfg)
    assert package["target"]["source"] == "builtin:smollm2-135m" and package["target"]["build"] is None
    with pytest.raises(ConfigError, match="does not exist on this machine"):
        packaged._model_dir({"source": str(tmp_path / "gone.gguf")}, tmp_path)
    from experiments.targets.models.minilm import model_dir
    assert packaged._model_dir({"source": "builtin:minilm"}, tmp_path) == model_dir()


def test_an_encoder_champion_loads_as_pyfunc_and_embeds_like_the_engine(tmp_path):
    import numpy as np

    from experiments.judge.embedding_eval import tokenized
    from experiments.serving import build_engine
    from experiments.targets.kinds import load_tokenizer
    from experiments.targets.models.minilm import model_dir

    cfg = compose(["target=minilm", f"data_dir={tmp_path}", f"cache_dir={SHARED_CACHE}"])
    with open_dict(cfg):
        del cfg["hydra"]
    base = EagerBaseline().apply(Candidate(Target("minilm", "embedding", model_dir())))
    ids = log_sweep(cfg, [("baseline", "accepted", base, 5.0)])
    result = registry.promote(cfg.tracking, ids["baseline"], None)
    model = mlflow.pyfunc.load_model(f"models:/{result.model_name}@champion",
                                     model_config={"cache_dir": str(SHARED_CACHE)})
    texts = ["how do I sort a list?", "sorted(xs) returns a new sorted list"]
    vectors = np.array(model.predict(texts))
    engine = build_engine(base, 2, SHARED_CACHE / "artefacts")
    expected, _ = engine.embed(tokenized(load_tokenizer(model_dir()), texts, int(cfg.target.workload.max_tokens)))
    assert vectors.shape == expected.shape and np.allclose(vectors, expected, atol=1e-5)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


# --- a soak too short to tell a leak (issue 42) --------------------------------------------------------------
def test_promote_asks_for_a_longer_soak_where_the_sweeps_did_not_decide(cfg, sweep):
    client, rid = MlflowClient(), sweep["onnxruntime"]
    client.set_tag(rid, "roi.soak", "ran at c=2 (the gate's objective level): not decided by a 3-second soak")
    with pytest.raises(ConfigError, match="soaked too briefly to tell a leak") as err:
        registry.promote(cfg.tracking, rid, None)
    assert f"roi-ladder soak --run {rid}" in err.value.fix and not client.search_registered_models()
    client.set_tag(rid, "roi.soak.followup", "NOT clean after a 1800-second soak at c=2: leak_rss ... LEAK")
    with pytest.raises(ConfigError, match="longer soak was NOT clean"):
        registry.promote(cfg.tracking, rid, None)
    client.set_tag(rid, "roi.soak.followup", "clean after a 1800-second soak at c=2: leak_rss ... within budget")
    assert registry.promote(cfg.tracking, rid, None).version == "1"
    # a sweep soak that decided asks for nothing more
    client.set_tag(sweep["baseline"], "roi.soak", "ran at c=2 (the gate's objective level): clean")
    assert registry.promote(cfg.tracking, sweep["baseline"], None).version == "2"


def test_roi_ladder_soak_soaks_the_rungs_recipe_and_records_it_where_promote_reads_it(cfg, sweep, model_dir):
    """The follow-up soak, for real at a test's length: the recorded ONNX Runtime recipe built again, served,
    soaked at the level the sweep's soak ran at, and its outcome tagged on the rung's run."""
    from experiments.climb.followup_soak import soak_rung
    from experiments.record.console import SweepConsole

    rid = sweep["onnxruntime"]
    MlflowClient().set_tag(rid, "roi.soak", "ran at c=2 (the gate's objective level): not decided by a 3-second soak")
    short = OmegaConf.merge(cfg, {"soak": {"duration_s": 3.0, "warmup_s": 1.0, "window_s": 0.5, "horizon_h": 0.02,
                                           "max_drift": 1.0}})
    report = soak_rung(short, rid, SweepConsole())
    assert report.concurrency == 2 and report.measured_s > 2.5
    assert all(w.requests > 0 for w in report.windows)
    tags = MlflowClient().get_run(rid).data.tags
    assert tags["roi.soak.followup"].startswith(f"{report.outcome} after a ") and "at c=2: soak c=2" in tags[
        "roi.soak.followup"]
    assert {a.path for a in MlflowClient().list_artifacts(rid, "soak_followup")} >= {"soak_followup/report.md"}
    if report.outcome == "clean":
        assert registry.promote(cfg.tracking, rid, None).version == "1"
    else:
        with pytest.raises(ConfigError):
            registry.promote(cfg.tracking, rid, None)


def test_a_loaded_version_finds_its_cache_where_it_loads(monkeypatch, tmp_path):
    monkeypatch.delenv("ROI_LADDER_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert packaged.load_cache_dir() == tmp_path / ".roi" / "cache"
    monkeypatch.setenv("ROI_LADDER_HOME", str(tmp_path / "home"))
    assert packaged.load_cache_dir() == tmp_path / "home" / "cache"
