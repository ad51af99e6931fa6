import logging
import os
import sys
from pathlib import Path

import pytest

import experiments  # noqa: F401  (registers the config resolvers)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = str(REPO / "conf")
# Built models and engine artefacts the tests share: in the user's cache beside the engines' builds, so that they
# outlive a checkout (a fresh clone's second run trains no tiny-llm), keyed by what made them, the code included.
SHARED_CACHE = Path(os.environ.get("ROI_LADDER_TEST_CACHE")
                    or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "roi-ladder" / "test-cache")


@pytest.fixture(autouse=True)
def _console_restored(monkeypatch):
    """cli.main() wraps sys.stdout/err and the log record factory in the secret scrubber for the life of its
    process; run inside a test, the wrappers must end with it (else they outlive the test's closed capture)."""
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    factory = logging.getLogRecordFactory()
    yield
    logging.setLogRecordFactory(factory)


@pytest.fixture
def scratch_run(tmp_path):
    """An active MLflow run in a store of its own under tmp_path, artefacts included (a sqlite store's default
    artefact root is ./mlruns, in the checkout); yields the run, restores the tracking URI after."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        experiment = mlflow.create_experiment("scratch", artifact_location=(tmp_path / "artifacts").as_uri())
        with mlflow.start_run(experiment_id=experiment) as run:
            yield run
    finally:
        mlflow.set_tracking_uri(previous)


def compose(overrides=()):
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def built_model() -> Path:
    from experiments.targets.models.tiny_llm import TinyLlmRecipe, ensure_built

    cfg = compose(["data_dir=/tmp/unused"])
    return ensure_built(TinyLlmRecipe(**cfg.target.build), SHARED_CACHE, print)


def pytest_sessionstart(session):
    """Under pytest-xdist, the built-in model is built here, before the workers start: its training, sharing
    2 cores with another worker's sweeps, took 30 minutes instead of 6."""
    config = session.config
    if "not builds" in (config.option.markexpr or ""):
        return
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        print(f"\nthe built-in model, before the workers start: {built_model()}", flush=True)
        if "not slow" not in (config.option.markexpr or ""):
            print(f"vLLM's environment, before the workers start: {vllm_environment()}", flush=True)


def vllm_environment() -> str:
    """Made once per machine (uv, then its bytecode compiled on both cores: 1-3 min). Made beside the other
    worker's first sweep, it disturbed that sweep's measurements until its gate rejected an exact engine swap as
    inconsistent. A failure is test_vllm's to report."""
    from experiments.serving.backends.vllm.causal_lm import ENVIRONMENTS
    from experiments.serving.environments import EngineUnavailable, engines_home

    try:
        return str(ENVIRONMENTS["cpu"].ensure(engines_home(), print))
    except EngineUnavailable as exc:
        return f"not made ({exc})"


@pytest.fixture(scope="session")
def model_dir():
    return built_model()


@pytest.fixture(scope="session")
def tiny_target(model_dir):
    from experiments.core.recipe import Target

    return Target("tiny-llm", "causal-lm", model_dir)


# Under `make test`'s two workers, files are handed out in this order, one whole file at a time: the longest first,
# so that no long file starts last and keeps one worker busy alone. The first runs beside the built model's training
# (minutes on first use); the four after it need no tiny-llm and fill the other worker meanwhile.
LONGEST_FIRST = ("test_sweep_e2e", "test_smollm2_sweep", "test_sweep_minilm", "test_own_model_sweep", "test_vllm",
                 "test_gpu_extra", "test_llama_cpp",
                 "test_resilience", "test_launchers", "test_contamination", "test_ui_check", "test_distillation",
                 "test_architectures", "test_rungs_real")


# Fixtures that build or load a model (or need one built): a test using any of them, directly or through another
# fixture, is marked `builds`, so that `make test-fast` (-m "not slow and not builds") runs without building any.
BUILDING = {"model_dir", "tiny_target", "smollm2", "minilm", "folder", "llama", "qwen", "torch_engine"}


def pytest_collection_modifyitems(items):
    for item in items:
        if BUILDING & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.builds)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))     # stable: the rest keep their order
