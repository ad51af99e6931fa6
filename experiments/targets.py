"""Resolve `target.source` to a model folder on disk (building the built-in one when needed)."""
from __future__ import annotations

import os
from pathlib import Path

from experiments.errors import ConfigError
from experiments.models.corpus import Corpus
from experiments.models.tiny_llm import TinyLlmRecipe, ensure_built, task_include_path
from optimizers.base import Target

BUILTINS = {"builtin:tiny-llm": "causal-lm", "builtin:minilm": "embedding"}


def check_source(cfg_target) -> None:
    """Cheap checks before any long work starts."""
    source = str(cfg_target.source)
    if source.startswith("builtin:"):
        if source not in BUILTINS:
            raise ConfigError(f"unknown built-in target {source!r}", f"use one of: {', '.join(BUILTINS)}")
        if cfg_target.get("kind") != BUILTINS[source]:
            raise ConfigError(f"target.kind {cfg_target.get('kind')!r} does not match {source}, which is "
                              f"{BUILTINS[source]!r}", f"set target.kind={BUILTINS[source]} or drop the override")
        return
    path = Path(source).expanduser()
    if path.exists():
        missing = [what for what, ok in (
            ("config.json", (path / "config.json").exists()),
            ("*.safetensors weights", any(path.glob("*.safetensors"))),
            ("tokenizer files", (path / "tokenizer.json").exists() or (path / "tokenizer.model").exists()),
        ) if not ok]
        if missing:
            raise ConfigError(f"model folder {path} lacks {', '.join(missing)}",
                              "point target.source at a Hugging Face folder saved with save_pretrained "
                              "(safetensors weights and tokenizer included)")
        return
    if "/" in source and not source.startswith((".", "/")) and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ConfigError(f"target.source {source!r} looks like a hub id, but HF_HUB_OFFLINE=1 forbids downloads",
                          "download the model elsewhere, save it as a folder, and pass that folder's path")
    raise ConfigError(f"target.source {source!r} does not exist", "pass an existing model folder or builtin:tiny-llm")


def resolve(cfg_target, cache_dir: Path, data_dir: Path, progress) -> tuple[Target, list[str], Path | None]:
    """(target, held-out texts for the workload, lm-eval include path for its shipped tasks)."""
    check_source(cfg_target)
    if str(cfg_target.source) == "builtin:tiny-llm":
        recipe = TinyLlmRecipe(**cfg_target.build)
        model_dir = ensure_built(recipe, cache_dir, progress)
        texts = Corpus.from_stdlib(recipe.heldout_every).heldout
        tasks = task_include_path(model_dir, data_dir / "tasks" / model_dir.name)
        return Target(cfg_target.name, cfg_target.kind, model_dir), texts, tasks
    if str(cfg_target.source) == "builtin:minilm":
        from experiments.models.minilm import RetrievalSet, model_dir

        # The workload embeds the retrieval set's own queries and passages: short and long texts mixed.
        texts = RetrievalSet.from_stdlib(int(cfg_target.workload.texts), int(cfg_target.workload.seed)).texts()
        return Target(cfg_target.name, cfg_target.kind, model_dir()), texts, None
    raise ConfigError(f"target.source {cfg_target.source!r}: only the built-in targets have a workload corpus so far",
                      "use target=tiny-llm or target=minilm")
