"""Engine artefacts (exported graphs, compressed weights) in folders named by a hash of what made them.

Built once under a lock and checked by checksum on reuse (experiments/core/cache.py), so parallel sweeps share
them, and a crash or a corrupted file means a rebuild, never a half artefact."""
from __future__ import annotations

import hashlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from experiments.core.cache import build_once

log = logging.getLogger(__name__)


def weights_digest(model_dir: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(model_dir).glob("*.safetensors"))]


def model_identity(model_dir: Path):
    """What names a model folder in an artefact's key: its build manifest (file checksums) where it has one, else
    its path."""
    manifest = Path(model_dir) / "manifest.json"
    return json.loads(manifest.read_text()) if manifest.exists() else str(model_dir)


def source_digest(obj) -> str:
    """A digest of the source file of the module that defines `obj` (a builder function, a build recipe's class):
    caches outlive checkouts (tests keep theirs in the user's cache), so changed code must make a new artefact."""
    path = getattr(sys.modules.get(getattr(obj, "__module__", None)), "__file__", None)
    return hashlib.sha256(Path(path).read_bytes() if path else b"").hexdigest()[:16]


def cached(root: Path, prefix: str, recipe: dict, build: Callable[[Path], None],
           note: Callable[[str], None] = log.warning) -> tuple[Path, bool]:
    """(folder, reused): `root/<prefix>-<hash of recipe and of build's module>`, built by `build(folder)` once
    (experiments/core/cache.py)."""
    made_by = {**recipe, "builder": source_digest(build)}
    key = hashlib.sha256(json.dumps(made_by, sort_keys=True).encode()).hexdigest()[:12]
    out = Path(root) / f"{prefix}-{key}"
    return out, build_once(out, build, "cached artefact", note)
