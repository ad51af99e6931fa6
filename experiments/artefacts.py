"""Engine artefacts (exported graphs, compressed weights) in folders named by a hash of what made them.

A folder is reused only when its manifest's checksums still match its files; a build writes to a `.partial`
folder and renames it when complete, so a crash or a corrupted file means a rebuild, never a half artefact."""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from experiments.models.tiny_llm import manifest_ok, write_manifest

log = logging.getLogger(__name__)


def weights_digest(model_dir: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(model_dir).glob("*.safetensors"))]


def cached(root: Path, prefix: str, recipe: dict, build: Callable[[Path], None],
           note: Callable[[str], None] = log.warning) -> tuple[Path, bool]:
    """(folder, reused): `root/<prefix>-<hash of recipe>`, built by `build(folder)` unless a valid one exists.
    A folder whose files no longer match their sha256 in its manifest is rebuilt, with a note saying so."""
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    out = Path(root) / f"{prefix}-{key}"
    if out.exists():
        if manifest_ok(out):
            return out, True
        note(f"cached artefact {out} failed its checksum (a file changed or is missing); rebuilding it")
    shutil.rmtree(out, ignore_errors=True)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build(tmp)
    write_manifest(tmp)
    tmp.rename(out)
    return out, False
