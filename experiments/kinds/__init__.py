"""Target kinds: what differs between a causal LM and an encoder, in one module per kind.

experiments/kinds/<name>.py (the kind's name with `-` as `_`: causal_lm.py for `causal-lm`) defines KIND, a Kind
that says how its model is served and judged: whether it decodes token by token (which rungs fit), the latency
metrics its requests have, the ladder table's columns, which engine class runs a recipe, how its Hugging Face
folder is recognised, what its workload is cut from, where it sits on the roofline, and its Scorer (the
workload, the scores, the gate's criteria). The rest of the code asks `kind_of(target.kind)` rather than
testing the name, so a third kind (a reranker, a vision model) is one module here plus its configs
(conf/target/, the rows of its numeric settings in experiments/settings.py), and engine classes where none
of the existing ones serve it.

Every module in this package is a kind (kind_of finds one by its module's name). This one imports nothing of
the project but its errors: the recipe's Target (experiments/recipe.py) asks it too.
"""
from __future__ import annotations

import pkgutil
from functools import cache
from importlib import import_module
from pathlib import Path

from experiments.errors import ConfigError

# A table with no measured rung to say otherwise, and a run logged before target.kind was a param, are of this
# kind.
DEFAULT_KIND = "causal-lm"


class Kind:
    name: str = ""
    noun: str = ""                 # what a model of this kind is called in messages: "causal LM", "encoder"
    decodes: bool = False          # token by token (decode steps, a KV cache), or one forward pass per request
    metrics: tuple[str, ...] = ()  # the latency metrics its requests have (SLOs on others are left out)
    engines: dict[str, str] = {}   # recipe.engine -> "module:Class" of the engine that runs it
    folders: str = ""              # what its Hugging Face folders look like, for the error that finds none
    packaged_as: str | None = None  # what `roi-ladder promote` registers it as; None: not packaged yet
    throughput_unit: str = ""      # the tables' throughput column: "tokens/s", "embeddings/s"
    key_metrics: tuple[str, ...] = ()  # MLflow metrics a reviewer reads first: the UI's ladder view, a version's tags

    def columns(self, top: int) -> list[tuple[str, str, str]]:
        """(summary key, header, format) of the ladder table's measured columns."""
        raise NotImplementedError

    def throughput(self, level) -> float:
        """One load level's (a level.LevelReport) throughput, in throughput_unit."""
        raise NotImplementedError

    def level_metrics(self, level) -> dict[str, float]:
        """What MLflow records of one load level beyond the latencies, rates and resources every kind has."""
        raise NotImplementedError

    def engine(self, recipe) -> str | None:
        """The "module:Class" of the engine that runs `recipe` for this kind, or None."""
        return self.engines.get(recipe.engine)

    def claims(self, path: Path, architecture: str) -> bool:
        """Whether a Hugging Face folder with this architecture holds a model of this kind."""
        return False

    def check(self, cfg, model_dir: Path | None = None) -> None:
        """Cheap checks of the config before any long work; model_dir: the user's folder, already on disk, that
        the user's data can be checked against (None for a model still to build or convert)."""

    def folder_texts(self, cfg_target, path: Path) -> list[str]:
        """The texts a user's folder of this kind has its workload cut from; refuses what it cannot serve."""
        raise NotImplementedError

    def roofline_shape(self, model_dir: Path):
        """The model's roofline.ModelShape, or None where the roofline's counts do not fit this kind."""
        return None

    def scorer(self, cfg, target, texts: list[str], include_path: Path | None):
        """The sweep's Scorer: workload(), score(engine, stage, name), judge(report), and the baseline's
        `reference` (kept by the ledger)."""
        raise NotImplementedError


@cache
def names() -> tuple[str, ...]:
    """Every kind, from this package's modules."""
    return tuple(sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(__path__)))


def kind_of(name: str) -> Kind:
    if name not in names():
        raise ConfigError(f"target.kind {name!r} is unknown", f"use one of: {', '.join(names())}")
    return import_module(f"{__name__}.{name.replace('-', '_')}").KIND


def for_target(cfg, target, texts: list[str], include_path: Path | None):
    """The target's kind's Scorer for this sweep."""
    return kind_of(target.kind).scorer(cfg, target, texts, include_path)


def detect(path: Path, architecture: str) -> str | None:
    """The kind whose folders look like this one, or None."""
    return next((name for name in names() if kind_of(name).claims(path, architecture)), None)


def load_tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
