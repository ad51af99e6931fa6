"""Target kinds: what differs between a causal LM and an encoder, in one module per kind.

experiments/targets/kinds/<name>.py (the kind's name with `-` as `_`: causal_lm.py for `causal-lm`) defines KIND, a Kind
that says how its model is served and judged: whether it decodes token by token (which rungs fit), the latency
metrics its requests have, the ladder table's columns, which engine class runs a recipe, how its Hugging Face
folder is recognised, what its workload is cut from, where it sits on the roofline, and its Scorer (the
workload, the scores, the gate's criteria). The rest of the code asks `kind_of(target.kind)` rather than
testing the name, so a third kind (a reranker, a vision model) is one module here plus its configs
(conf/target/, the rows of its numeric settings in experiments/core/settings.py), and engine classes where none
of the existing ones serve it.

Every module in this package but `base` (the Kind class they share) is a kind; kind_of finds one by its
module's name. A kind's module imports base, never this registry.
"""
from __future__ import annotations

import pkgutil
from functools import cache
from importlib import import_module
from pathlib import Path

from experiments.core.errors import ConfigError
from experiments.core.names import DEFAULT_KIND  # noqa: F401  (kinds.DEFAULT_KIND)
from experiments.targets.kinds.base import Kind, load_tokenizer  # noqa: F401  (the package's names)


@cache
def names() -> tuple[str, ...]:
    """Every kind, from this package's modules."""
    return tuple(sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(__path__) if m.name != "base"))


def kind_of(name: str) -> Kind:
    if name not in names():
        raise ConfigError(f"target.kind {name!r} is unknown", f"use one of: {', '.join(names())}")
    return import_module(f"{__name__}.{name.replace('-', '_')}").KIND


def for_target(cfg, target, texts: list[str], include_path: Path | None):
    """The target's kind's Scorer for this sweep."""
    return kind_of(target.kind).scorer(cfg, target, texts, include_path)


def detect(path: Path, architecture: str, given: str | None = None) -> str:
    """The kind whose folders look like this one (each kind says what its folders hold); the given kind where
    none claims it (the user knows, e.g. an encoder saved as BertForMaskedLM)."""
    found = next((name for name in names() if kind_of(name).claims(path, architecture)), None) or given
    if found is None:
        served = " and ".join(kind_of(name).folders for name in names())
        raise ConfigError(f"model folder {path}: cannot tell its kind from architecture {architecture!r}",
                          f"ROI Ladder serves {served}; set target.kind if this one is either")
    return found
