"""The sweep's ledger: what a sweep has done, written atomically after every step, so that running the same sweep
again after a crash, a reboot or a SIGKILL continues where it stopped.

`<data_dir>/ledger/<experiment>--<target>.json` holds the ids a person may look for (parent and rung MLflow runs,
verdicts, recipes and model folders); a signed pickle beside it holds what the next rungs need from the finished
ones (their measurements, the baseline's reference scores). Each rung's key chains the sweep-wide config with
the configs of every rung up to it: changing one rung invalidates that rung and those after it, nothing before.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from experiments.tracking import slug

VERSION = 1
# Not part of what a rung measures: where runs are shown, labels, and the resume switch itself.
NOT_MEASURED = ("hydra", "ladder", "isolation", "resume", "profile_name")
NOT_MEASURED_TRACKING = ("ui_host", "ui_port", "ui_allowed_hosts", "ui_cors_allowed_origins")


def sweep_key(cfg) -> str:
    """What every rung's measurements depend on: the whole resolved config but the ladder and the labels."""
    tree = {key: _plain(cfg[key]) for key in cfg if key not in NOT_MEASURED}
    for key in NOT_MEASURED_TRACKING:
        tree.get("tracking", {}).pop(key, None)
    return _digest(tree)


def rung_keys(cfg, names: list[str]) -> dict[str, str]:
    """name -> a key over the sweep-wide config and every rung's config (and limits) up to this one."""
    chain, keys = sweep_key(cfg), {}
    limits = _plain(cfg.isolation)
    for name in names:
        rung = _plain(cfg.ladder.rungs[name])
        own_limits = (limits.get("rungs") or {}).get(name)
        chain = _digest([chain, name, rung, {k: v for k, v in limits.items() if k != "rungs"}, own_limits])
        keys[name] = chain
    return keys


@dataclass
class Entry:
    name: str
    key: str
    run_id: str
    status: str = "running"     # running | done
    pid: int | None = None      # the rung's child process, while it runs
    verdict: str = ""
    reason: str = ""
    recipe: dict = field(default_factory=dict)
    model_dir: str = ""
    finished_at: str = ""


@dataclass
class Resume:
    """What a new run of the same sweep keeps: the parent run and the finished rungs whose keys still match."""
    parent_run_id: str
    sweep_id: str
    kept: list[Entry]
    stale: list[Entry]          # interrupted, or made invalid by a config change: their runs get marked
    state: dict                 # outcomes of the kept rungs, the baseline's reference, the score cache


class Ledger:
    def __init__(self, data_dir: Path, experiment: str, target: str):
        folder = Path(data_dir) / "ledger"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{slug(experiment)}--{slug(target)}.json"
        self.state_path = self.path.with_suffix(".state")
        self._key = _secret(folder / ".hmac-key")
        self.doc: dict = {}

    # --- reading ------------------------------------------------------------------------------------------
    def resumable(self, key: str, keys: dict[str, str]) -> tuple[Resume | None, str]:
        """(what to keep, why) — None with the reason when the sweep starts afresh."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None, "no earlier sweep of this experiment and target"
        except (OSError, ValueError) as exc:
            return None, f"the ledger {self.path} is unreadable ({exc}); a new sweep starts"
        if doc.get("version") != VERSION or doc.get("status") == "finished":
            return None, "the last sweep finished"
        if doc.get("sweep_key") != key:
            return None, "the last sweep was unfinished, but its config differs beyond the ladder: a new sweep starts"
        entries = [Entry(**e) for e in doc.get("rungs", [])]
        state = self._read_state()
        kept: list[Entry] = []
        for entry in entries:
            if entry.status != "done" or keys.get(entry.name) != entry.key or entry.name not in state.get("outcomes", {}):
                break
            kept.append(entry)
        stale = entries[len(kept):]
        return Resume(doc["parent_run_id"], doc["sweep_id"], kept, stale, state), (
            f"resuming sweep {doc['sweep_id']}: {len(kept)} rung(s) done and kept"
            + (f", {len(stale)} to redo ({', '.join(e.name + ' ' + (e.status if e.status == 'running' else 'changed') for e in stale)})"
               if stale else ""))

    def _read_state(self) -> dict:
        """The signed pickle; anything that does not verify is ignored (those rungs are redone), never loaded."""
        try:
            blob = self.state_path.read_bytes()
        except OSError:
            return {}
        signature, payload = blob[:32], blob[32:]
        if not hmac.compare_digest(signature, hmac.new(self._key, payload, hashlib.sha256).digest()):
            return {}
        return pickle.loads(payload)   # signed with this data dir's own key: written by a sweep, not a user

    # --- writing ------------------------------------------------------------------------------------------
    def begin(self, key: str, parent_run_id: str, sweep_id: str, kept: list[Entry]) -> None:
        self.doc = {"version": VERSION, "sweep_key": key, "parent_run_id": parent_run_id, "sweep_id": sweep_id,
                    "status": "running", "pid": os.getpid(), "rungs": [asdict(e) for e in kept]}
        self._write()

    def started(self, name: str, key: str, run_id: str) -> None:
        self.doc["rungs"].append(asdict(Entry(name, key, run_id)))
        self._write()

    def child(self, pid: int) -> None:
        self.doc["rungs"][-1]["pid"] = pid
        self._write()

    def done(self, entry_update: dict, state: dict) -> None:
        """The rung's outcome first (signed state), then the ledger that points at it."""
        payload = pickle.dumps(state)
        _atomic_write(self.state_path, hmac.new(self._key, payload, hashlib.sha256).digest() + payload)
        self.doc["rungs"][-1].update(entry_update, status="done", pid=None,
                                     finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self._write()

    def finish(self, status: str) -> None:
        """finished (a later run starts a new sweep) or interrupted (a later run resumes)."""
        self.doc["status"] = status
        self._write()

    def _write(self) -> None:
        _atomic_write(self.path, json.dumps(self.doc, indent=1, default=str).encode())


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _secret(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        key = os.urandom(32)
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        try:
            os.link(tmp, path)         # two sweeps starting at once (a multirun) agree on one key
        except FileExistsError:
            pass
        tmp.unlink()
        return path.read_bytes()


def _plain(node):
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]
