"""Resolve `target.source` to a model folder on disk (building the built-in one when needed)."""
from __future__ import annotations

import os
from pathlib import Path

from experiments.core.cache import manifest_ok
from experiments.core.errors import ConfigError
from experiments.core.recipe import Target
from experiments.targets.folder import ModelFolder, inspect as inspect_folder
from experiments.targets.kinds import kind_of
from experiments.targets.models import smollm2
from experiments.targets.models.corpus import Corpus, corpus_texts
from experiments.targets.models.gguf import check_architecture, converted_dir, ensure_converted
from experiments.targets.models.minilm import RetrievalSet, model_dir
from experiments.targets.models.tiny_llm import TinyLlmRecipe, built_dir, ensure_built, task_include_path

BUILTINS = {"builtin:tiny-llm": "causal-lm", "builtin:minilm": "embedding", "builtin:smollm2-135m": "causal-lm"}
BUILTIN_NAMES = {"tiny-llm", "minilm", "smollm2"}


def check_source(cfg_target) -> ModelFolder | None:
    """Cheap checks before any long work starts; the user's folder as inspected (None for a built-in or GGUF)."""
    source = str(cfg_target.source)
    if source.startswith("builtin:"):
        if source not in BUILTINS:
            raise ConfigError(f"unknown built-in target {source!r}", f"use one of: {', '.join(BUILTINS)}")
        if cfg_target.get("kind") != BUILTINS[source]:
            raise ConfigError(f"target.kind {cfg_target.get('kind')!r} does not match {source}, which is "
                              f"{BUILTINS[source]!r}", f"set target.kind={BUILTINS[source]} or drop the override")
        return None
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        if _given_kind(cfg_target) not in (None, "causal-lm"):
            raise ConfigError(f"target.kind={cfg_target.kind} does not match {path.name}: a GGUF holds a causal LM",
                              "set target.kind=causal-lm or drop the override")
        check_architecture(path)
        return None
    if path.exists():
        folder = inspect_folder(path, _given_kind(cfg_target))
        if cfg_target.get("name") in BUILTIN_NAMES:
            raise ConfigError(f"target.source={source} is a model folder, but the target config is the built-in "
                              f"{cfg_target.name}'s", f"add target=folder: `roi-ladder sweep target=folder "
                              f"target.source={source}`")
        return folder
    if "/" in source and not source.startswith((".", "/")) and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ConfigError(f"target.source {source!r} looks like a hub id, but HF_HUB_OFFLINE=1 forbids downloads",
                          "download the model elsewhere, save it as a folder, and pass that folder's path")
    raise ConfigError(f"target.source {source!r} does not exist", "pass an existing model folder or builtin:tiny-llm")


def resolve(cfg_target, cache_dir: Path, data_dir: Path, progress,
            on_step=None) -> tuple[Target, list[str], Path | None]:
    """(target, held-out texts for the workload, lm-eval include path for its shipped tasks); on_step(done,
    total) counts the training steps of a model built here."""
    check_source(cfg_target)
    source = str(cfg_target.source)
    if source == "builtin:tiny-llm":
        model_dir = model_path(source, cfg_target.build, cache_dir, progress, on_step)
        texts = texts_unbuilt(cfg_target)
        tasks = task_include_path(model_dir, data_dir / "tasks" / model_dir.name)
        return Target(cfg_target.name, cfg_target.kind, model_dir), texts, tasks
    if source == "builtin:minilm":
        # The workload embeds the retrieval set's own queries and passages: short and long texts mixed.
        texts = RetrievalSet.from_stdlib(int(cfg_target.workload.texts), int(cfg_target.workload.seed)).texts()
        return Target(cfg_target.name, cfg_target.kind, model_path(source, None, cache_dir)), texts, None
    if source == "builtin:smollm2-135m":
        model_dir = model_path(source, None, cache_dir, progress)
        tasks = smollm2.task_include_path(data_dir / "tasks" / model_dir.name)
        texts = texts_unbuilt(cfg_target)
        return Target(cfg_target.name, cfg_target.kind, model_dir), texts, tasks
    return _folder(cfg_target, cache_dir, progress)


def model_path(source: str, build, cache_dir: Path, progress=print, on_step=None) -> Path:
    """The model folder `source` names on this machine: a built-in built or converted once (cached under
    cache_dir), a GGUF file converted once, or the user's folder as given. `build`: tiny-llm's recipe."""
    if source == "builtin:tiny-llm":
        return ensure_built(TinyLlmRecipe(**build), cache_dir, progress, on_step)
    if source == "builtin:minilm":
        return model_dir()
    if source == "builtin:smollm2-135m":
        return smollm2.ensure_built(cache_dir, progress)
    path = Path(source).expanduser()
    return ensure_converted(path, cache_dir, progress) if path.suffix == ".gguf" else path


def kind_unbuilt(cfg_target) -> str:
    """The target's kind without building anything (a user's folder: from its config)."""
    source = str(cfg_target.source)
    if source in BUILTINS:
        return BUILTINS[source]
    folder = check_source(cfg_target)
    return folder.kind if folder is not None else "causal-lm"        # a GGUF holds a causal LM


def texts_unbuilt(cfg_target) -> list[str]:
    """A causal LM target's held-out texts for a synthetic workload, without building its model."""
    if str(cfg_target.source) == "builtin:tiny-llm":
        return Corpus.from_stdlib(TinyLlmRecipe(**cfg_target.build).heldout_every).heldout
    return corpus_texts(cfg_target.workload.get("corpus"))


def built_model_dir(cfg_target, cache_dir: Path) -> Path | None:
    """The target's model folder if it is on disk now (a user's folder, or a built-in or GGUF built before);
    None where only a build would make it."""
    source = str(cfg_target.source)
    if source == "builtin:tiny-llm":
        out = built_dir(TinyLlmRecipe(**cfg_target.build), cache_dir)
    elif source == "builtin:smollm2-135m":
        out = converted_dir(smollm2.gguf_file(), cache_dir)
    elif source.startswith("builtin:"):
        return None
    elif (path := Path(source).expanduser()).suffix == ".gguf":
        out = converted_dir(path, cache_dir)
    else:
        return path
    return out if out.is_dir() and manifest_ok(out) else None


def _folder(cfg_target, cache_dir: Path, progress) -> tuple[Target, list[str], None]:
    """A user's Hugging Face folder, or a GGUF file converted once into one. Its detected kind is written back
    into the config, so that the runs' params (and `roi-ladder promote`) say what it is."""
    folder = inspect_folder(model_path(str(cfg_target.source), None, cache_dir, progress), _given_kind(cfg_target))
    cfg_target.kind = folder.kind
    texts = kind_of(folder.kind).folder_texts(cfg_target, folder.path)
    return Target(str(cfg_target.name), folder.kind, folder.path), texts, None


def _given_kind(cfg_target) -> str | None:
    kind = cfg_target.get("kind")
    return None if kind in (None, "auto") else str(kind)
