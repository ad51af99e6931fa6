"""A promoted champion as a package: the recipe and target it was measured with, made into the same candidate
again on this machine. A serving engine's champion carries what runs it — engine, version, start command and
environment — as tags of its registered version (server.*), and `roi-ladder serve --champion` starts that engine."""
from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException

from experiments.core.errors import ConfigError
from experiments.core.names import Tag
from experiments.core.recipe import Candidate, Recipe, Target
from experiments.record import tracking
from experiments.targets.resolve import model_path

SERVER_TAG = "server."


def candidate_of(package: dict, cache_dir: Path) -> Candidate:
    """The candidate a package's recipe.json describes, its model found again as the sweep found it."""
    t = package["target"]
    target = Target(t["name"], t["kind"], _model_dir(t, cache_dir))
    return Candidate(target, Recipe(**package["recipe"]), tuple(package["rungs"]))


def load_cache_dir() -> Path:
    """Where a loaded version finds (or builds) its model and artefacts: $ROI_LADDER_HOME/cache, else .roi/cache in
    the current folder, as a sweep started there keeps them (conf/config.yaml's data_dir and cache_dir)."""
    return Path(os.environ.get("ROI_LADDER_HOME") or ".roi").expanduser().absolute() / "cache"


def server_tags(run_tags: dict[str, str]) -> dict[str, str]:
    """A served rung's roi.server.* tags (engine, version, command, environment) as a version's server.* tags."""
    return {SERVER_TAG + k.removeprefix(Tag.SERVER): v for k, v in run_tags.items() if k.startswith(Tag.SERVER)}


def champion_package(tracking_cfg, name: str, alias: str = "champion") -> tuple[dict, str]:
    """(recipe.json of the model's `alias` version, that version)."""
    tracking.connect(tracking_cfg)
    uri = f"models:/{name}@{alias}"
    try:
        version = str(mlflow.MlflowClient().get_model_version_by_alias(name, alias).version)
        folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri))
    except MlflowException as exc:
        raise ConfigError(f"no {alias} version of model {name!r} at {tracking_cfg.uri}: {str(exc)[:200]}",
                          "promote a rung first (make promote), or name the model with NAME=...") from None
    found = sorted(folder.rglob("recipe.json"))
    if not found:
        raise ConfigError(f"{uri} holds no recipe.json", "promote it again with this version of roi-ladder")
    return json.loads(found[0].read_text()), version


def _model_dir(target: dict, cache_dir: Path) -> Path:
    source = target["source"]
    if not source.startswith("builtin:") and not Path(source).expanduser().exists():
        raise ConfigError(f"the promoted model's source {source} does not exist on this machine",
                          "copy the model folder (or GGUF file) there, or load the model where it was promoted")
    return model_path(source, target.get("build"), cache_dir)
