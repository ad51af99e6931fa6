"""The sweep's ledger: what a sweep has done, written atomically after every step, so that running the same sweep
again after a crash, a reboot or a SIGKILL continues where it stopped.

`<data_dir>/ledger/<experiment>--<target>--<sweep key>.json` holds the ids a person may look for (parent and rung
MLflow runs, verdicts, recipes and model folders); a signed pickle beside it holds what the next rungs need from
the finished ones (their measurements, the baseline's reference scores). The sweep key covers the config but the
ladder, and the machine; each rung's key chains it with the configs of every rung up to it: changing one rung
invalidates that rung and those after it, nothing before. A lock held for the sweep's life keeps a second copy of
the same sweep from writing the same ledger.
"""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import pickle
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from experiments.core.errors import ConfigError
from experiments.core.names import Tag
from experiments.record import tracking

VERSION = 2
# Not part of what a rung measures: where runs are shown, labels, the resume switch, what runs after the ladder
# (diagnosis, hardware for the roofline) and how rungs are run (isolation; a rung's own limits count for it).
NOT_MEASURED = ("hydra", "ladder", "isolation", "resume", "profile_name", "diagnosis", "hardware")
NOT_MEASURED_TRACKING = ("ui_host", "ui_port", "ui_allowed_hosts", "ui_cors_allowed_origins")


def sweep_key(cfg, machine: dict) -> str:
    """What every rung's measurements depend on: the resolved config but the ladder and the labels, and the
    machine (CPU, GPU, library versions: measurements from another one are not kept)."""
    tree = {key: _plain(cfg[key]) for key in cfg if key not in NOT_MEASURED}
    for key in NOT_MEASURED_TRACKING:
        tree.get("tracking", {}).pop(key, None)
    return _digest([tree, {k: v for k, v in machine.items() if k != "git_commit"}])


def rung_keys(cfg, names: list[str], key: str) -> dict[str, str]:
    """name -> a key over the sweep key and every rung's config (and own limits) up to this one."""
    chain, keys = key, {}
    own_limits = _plain(cfg.isolation.get("rungs")) or {}
    for name in names:
        chain = _digest([chain, name, _plain(cfg.ladder.rungs[name]), own_limits.get(name)])
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
    def __init__(self, data_dir: Path, experiment: str, target: str, key: str):
        folder = Path(data_dir) / "ledger"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.key = key
        self.path = folder / f"{tracking.slug(experiment)}--{tracking.slug(target)}--{key[:12]}.json"
        self.state_path = self.path.with_suffix(".state")
        self._secret = _secret(folder / ".hmac-key")
        self._lock = None
        self.doc: dict = {}

    def lock(self) -> None:
        """Held until this process ends: one copy of a sweep at a time writes its ledger."""
        self._lock = open(self.path.with_suffix(".lock"), "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "another process"
            raise ConfigError(f"the same sweep (experiment, target and config) is already running here ({holder}), "
                              f"and its ledger {self.path.name} is locked",
                              "wait for it, stop it (Ctrl-C: the same command resumes it later), or change the config "
                              "or the experiment name to run another one") from None
        self._lock.truncate(0)
        self._lock.write(f"pid {os.getpid()}")
        self._lock.flush()

    # --- reading ------------------------------------------------------------------------------------------
    def resumable(self, keys: dict[str, str]) -> tuple[Resume | None, str]:
        """(what to keep, why) — None with the reason when the sweep starts afresh."""
        try:
            doc = json.loads(self.path.read_text())
            entries = [Entry(**e) for e in doc.get("rungs", [])]
        except FileNotFoundError:
            return None, "no unfinished sweep with this config"
        except (OSError, ValueError, TypeError) as exc:
            return None, f"the ledger {self.path.name} is unreadable ({exc}): a new sweep starts"
        if doc.get("version") != VERSION or doc.get("status") == "finished":
            return None, "the last sweep with this config finished"
        state = self._read_state()
        kept: list[Entry] = []
        for entry in entries:
            if entry.status != "done" or keys.get(entry.name) != entry.key or \
                    state.get("keys", {}).get(entry.name) != entry.key:
                break
            kept.append(entry)
        stale = entries[len(kept):]
        why = f"resuming sweep {doc['sweep_id']}: {len(kept)} rung(s) done and kept"
        if stale:
            why += f", {len(stale)} to redo (" + ", ".join(
                f"{e.name} {'interrupted' if e.status == 'running' else 'changed'}" for e in stale) + ")"
        if doc.get("git_commit") != tracking.git_commit():
            why += f"; the code changed since (commit {doc.get('git_commit')} -> {tracking.git_commit()})"
        return Resume(doc["parent_run_id"], doc["sweep_id"], kept, stale, state), why

    def _read_state(self) -> dict:
        """The signed pickle; anything that does not verify or load is ignored (those rungs are redone)."""
        try:
            blob = self.state_path.read_bytes()
        except OSError:
            return {}
        signature, payload = blob[:32], blob[32:]
        if not hmac.compare_digest(signature, hmac.new(self._secret, payload, hashlib.sha256).digest()):
            return {}
        try:
            state = pickle.loads(payload)   # signed with this data dir's own key: written by a sweep, not a user
        except Exception:  # noqa: BLE001  (written by older code: its classes moved; redo, do not crash)
            return {}
        return state if isinstance(state, dict) and state.get("version") == VERSION else {}

    # --- writing ------------------------------------------------------------------------------------------
    def begin(self, parent_run_id: str, sweep_id: str, kept: list[Entry]) -> None:
        self.doc = {"version": VERSION, "sweep_key": self.key, "parent_run_id": parent_run_id, "sweep_id": sweep_id,
                    "status": "running", "pid": os.getpid(), "git_commit": tracking.git_commit(),
                    "rungs": [asdict(e) for e in kept]}
        self._write()

    def started(self, name: str, key: str, run_id: str) -> None:
        self.doc["rungs"].append(asdict(Entry(name, key, run_id)))
        self._write()

    def child(self, pid: int) -> None:
        self.doc["rungs"][-1]["pid"] = pid
        self._write()

    def done(self, entry_update: dict, state: dict) -> None:
        """The rung's outcome first (signed state), then the ledger that points at it."""
        keys = {e["name"]: e["key"] for e in self.doc["rungs"]}
        payload = pickle.dumps({**state, "version": VERSION, "keys": keys})
        _atomic_write(self.state_path, hmac.new(self._secret, payload, hashlib.sha256).digest() + payload)
        self.doc["rungs"][-1].update(entry_update, status="done", pid=None,
                                     finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self._write()

    def finish(self, status: str) -> None:
        """finished (a later run starts a new sweep) or interrupted (a later run resumes)."""
        self.doc["status"] = status
        self._write()

    def _write(self) -> None:
        _atomic_write(self.path, json.dumps(self.doc, indent=1, default=str).encode())


def restore(resume: Resume, kind, scores: dict) -> list:
    """The finished rungs' outcomes, and what later rungs need from them: the baseline's reference scores
    (fidelity is always against it) and the cache of scores measured on the same numerics."""
    kept = [resume.state["outcomes"][e.name] for e in resume.kept]
    names = {o.name for o in kept}
    scores.update({k: v for k, v in resume.state.get("scores", {}).items() if v[2] in names})
    if names:
        kind.reference = resume.state.get("reference")
    return kept


def mark_stale(resume: Resume, experiment_id: str) -> None:
    """Runs of the earlier attempt that will be redone: one still RUNNING (the sweep died during it, whether or
    not the ledger had recorded it yet) is KILLED; a finished one whose config changed is superseded."""
    kept = {e.run_id for e in resume.kept}
    running = MlflowClient().search_runs([experiment_id], max_results=10_000, filter_string=(
        f"tags.mlflow.parentRunId = '{resume.parent_run_id}' and attributes.status = 'RUNNING'"))
    for run in running:
        if run.info.run_id not in kept:
            tracking.mark_run(run.info.run_id, {Tag.VERDICT: "interrupted", Tag.REASON: "the sweep stopped "
                              "during this rung (killed, crashed or stopped at once); the resumed sweep redoes it"},
                              "KILLED")
    for entry in resume.stale:
        if entry.status == "done" and tracking.run_status(entry.run_id) is not None:
            tracking.mark_run(entry.run_id, {Tag.SUPERSEDED: "its config, or an earlier rung's, changed; the "
                                             "resumed sweep redoes it"})


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
            f.flush()
            os.fsync(f.fileno())
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
