"""Folders built once and shared: built models, engine artefacts, students.

Several sweeps may reach one cache at once (Hydra multirun, two terminals). A folder is built under a lock of
its own, in a `.partial-*` folder unique to the builder, and renamed into place when complete: the second
sweep waits and reuses it, a crash leaves no half folder, and a folder whose files no longer match their
sha256 in its manifest is rebuilt, with a note saying so."""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


def build_once(out: Path, build: Callable[[Path], None], what: str = "cached folder",
               note: Callable[[str], None] = log.warning) -> bool:
    """Make `out` by `build(tmp)` unless a valid one exists; True when it was reused."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked(out.with_name(f".{out.name}.lock")):
        if out.exists():
            if manifest_ok(out):
                return True
            note(f"{what} {out} failed its checksum (a file changed or is missing); rebuilding it")
            shutil.rmtree(out)
        for stale in out.parent.glob(f".{out.name}.partial-*"):   # left by a killed builder (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
        try:
            build(tmp)
            write_manifest(tmp)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return False


def write_atomic(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of it (another sweep may read it right now)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive across processes on this machine while the block runs (flock: released if the holder dies)."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(folder: Path) -> None:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest = {str(p.relative_to(folder)): _digest(p) for p in files}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))


def manifest_ok(folder: Path) -> bool:
    mf = folder / "manifest.json"
    if not mf.exists():
        return False
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError:
        return False
    return all((folder / rel).is_file() and _digest(folder / rel) == sha for rel, sha in manifest.items())
