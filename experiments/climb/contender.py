"""Every measurement of an engine in a fresh process of its own, where that engine is the only one alive.

Two engines in one process measure each other: a compiled challenger kept alive beside the eager champion once
made the champion run 2.9x slower than in its own run (issue 16), whatever the mechanism (threads, a compiler's
worker pool, allocator state). So the rung's own process only orchestrates and never builds an engine: its load
ladder and scores and its soak happen in children of the fork server (experiments/measure/isolation.py), each of which
builds one engine, measures it and exits. In the gate's rounds each side is built once in a process of its own
and stopped (SIGSTOP) while the other runs: a compiled engine is not rebuilt forty times, and nothing a rival
built or started, threads included, can run beside the one being measured. gate.interleaved.fresh_build_per_run
builds each run afresh instead (two builds of one recipe keep speeds of their own: that samples them too).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import os
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console

from experiments.core.recipe import Candidate
from experiments.core.reports import BenchmarkReport, LevelReport
from experiments.judge.accuracy import AccuracyReport
from experiments.measure import isolation
from experiments.measure.load import run_level
from experiments.measure.load_ladder import run_benchmark
from experiments.record import tracking
from experiments.record.console import SweepConsole, quiet_libraries
from experiments.serving import build_engine
from experiments.serving.backends.served import ServedEngine
from experiments.serving.servers import serve
from experiments.targets.workload import ROUNDS

WHAT_WAS_DONE = ("each measurement in a fresh process of its own (fork-server child): the rung's load ladder and "
                 "scores, the soak, and each side of the gate's rounds (champion and challenger each built once in "
                 "a process of its own and stopped while the other runs; or a fresh build per run with "
                 "gate.interleaved.fresh_build_per_run); no other engine alive in it")


class MeasurementFailed(RuntimeError):
    """A measuring process gave no result: the reason (signal, limit, exit code, its last log lines)."""


@dataclass(frozen=True)
class Measured:
    """One candidate's load ladder and scores, from the process that built it."""
    bench: BenchmarkReport
    accuracy: list[AccuracyReport]
    fidelity: object
    artefact_bytes: float
    weight_bits: float
    build_seconds: float | None
    artefact_reused: bool | None
    scores_reused_from: str | None    # the rung whose scores these are (same numerics), or None: scored here
    reference: object                 # the baseline's reference scores, once recorded
    pid: int
    server: dict | None = None        # a serving engine's server: engine, version, command, log, startup_s


@dataclass(frozen=True)
class Apart:
    """Where and under which limits a measuring process runs."""
    limits: isolation.Limits
    logs: Path
    stem: str                         # rung name and run id: each process's log is <stem>-<what>.log

    def run(self, what: str, fn, *args, on_progress=None):
        done = isolation.run(fn, args, self.limits, self.logs / f"{self.stem}-{what}.log", on_progress=on_progress)
        if done.failure:
            raise MeasurementFailed(f"{what}: {done.failure}")
        return done.value


def measure(cand: Candidate, sweep, name: str, apart: Apart, on_progress=None) -> Measured:
    """Build, load ladder, accuracy and fidelity in a process of its own; its stages and counts go to
    on_progress (console.Stage.relayed)."""
    return apart.run("measure", _measure_here, cand, replace(sweep, ui=None), name, on_progress=on_progress)


def scored_more(cand: Candidate, reports: list[AccuracyReport], sweep, name: str, who: str, apart: Apart,
                on_progress=None) -> list[AccuracyReport]:
    """`reports` of `cand` (the rung's `who`: challenger or champion) completed (Scorer.score_more) on a fresh
    build in a process of its own."""
    return apart.run(f"scores-{who}", _score_more_here, cand, reports, replace(sweep, ui=None), name,
                     on_progress=on_progress)


ROUNDS_DONE = {True: "each run a fresh build in a fresh process of its own",
               False: "each side built once in a process of its own, stopped (SIGSTOP) while the other runs"}


@contextlib.contextmanager
def round_runs(builds: dict, fresh_build_per_run: bool, workload, load, concurrency: int, confidence: float,
               apart: Apart, attempt: int, on_build=None):
    """One callable per side (`who` → a run of one gate round, giving its LevelReport), each measuring alone;
    builds[who]() builds that side's engine (picklable: it runs in the child). Resident (the default): each side
    built once in a process of its own, stopped between its runs, so its rival's runs happen while nothing of it
    can run. Fresh: each run a fresh build in a fresh process. on_build(built, of) counts the resident builds.
    A side's n-th run sends the workload's requests of block ROUNDS + n: the same prompts as its rival's n-th
    (the round's pairing), none sent to its server before."""
    count = dict.fromkeys(builds, 0)

    def block(who) -> int:
        count[who] += 1
        return ROUNDS + count[who] - 1
    if fresh_build_per_run:
        def fresh(who):
            def one():
                n = block(who)
                return apart.run(f"rounds{attempt}-{who}-{count[who]}", _level_here, builds[who], workload, load,
                                 concurrency, confidence, n)
            return one
        yield {who: fresh(who) for who in builds}
        return
    with contextlib.ExitStack() as stack:
        built = {}
        for who, build in builds.items():
            if on_build:
                on_build(len(built), len(builds))
            built[who] = stack.enter_context(isolation.Resident(
                build, apart.limits, apart.logs / f"{apart.stem}-rounds{attempt}-{who}.log"))
        yield {who: functools.partial(_resident_level_run, built[who], workload, load, concurrency, confidence,
                                      functools.partial(block, who))
               for who in builds}


def _resident_level_run(contender: isolation.Resident, workload, load, concurrency: int, confidence: float,
                        block) -> LevelReport:
    try:
        return contender.call(_level_on, workload, load, concurrency, confidence, block())
    except isolation.ResidentFailed as exc:
        raise MeasurementFailed(f"{contender.log_path.stem}: {exc}") from None


def in_own_process(build, apart: Apart, workload, load, concurrency: int, confidence: float, what: str,
                   block: int = ROUNDS) -> LevelReport:
    """level_run for any picklable builder (make bench-gate's wrapped engines)."""
    return apart.run(what, _level_here, build, workload, load, concurrency, confidence, block)


def soaked(judge, cand: Candidate, bench: BenchmarkReport, criteria: list, sweep, name: str, run_id: str,
           apart: Apart, on_progress=None) -> list:
    """judge(engine, bench, criteria, sweep, name) (soaking.soak_criterion) on a fresh build of `cand`, in a
    process of its own that logs to the rung's run."""
    return apart.run("soak", _soak_here, judge, cand, bench, criteria, replace(sweep, ui=None), name, run_id,
                     on_progress=on_progress)


def numerics_key(cand: Candidate) -> tuple:
    """What decides the numbers lm-eval and fidelity see; batching settings do not (ONNX Runtime's paged
    export on CUDA is another graph, so it counts). Compiled and eager forwards are scored apart: scores
    go through the forward that serves, whose kernels differ. So are two weight formats of one quantization
    (llama.cpp's Q4_0 and IQ4_NL round differently) and a KV cache stored in fewer bits."""
    r = cand.recipe
    paged_graph = r.engine == "onnxruntime" and r.batching == "continuous"
    return (str(cand.target.model_dir), r.engine, r.precision, r.quantization, r.weight_format, r.kv_cache_dtype,
            r.execution_provider, r.compile, r.cuda_graph, paged_graph)


# --- in the child -----------------------------------------------------------------------------------------------
def _quiet_console():
    """The child's console goes to its log (stderr there); its stages and counts are relayed to the rung's
    process, which shows them."""
    quiet_libraries()
    return SweepConsole(Console(stderr=True, width=160), relay=True)


def _measure_here(cand: Candidate, sweep, name: str) -> Measured:
    cfg = sweep.cfg
    ui = _quiet_console()
    engine = _built(cand, cfg, ui, name)
    try:
        with ui.stage(f"{name}: load ladder") as st:
            bench = run_benchmark(engine, sweep.workload, cfg.benchmark, cfg.gate.confidence,
                                  on_level=_level_counter(st, cfg.benchmark))
        key = numerics_key(cand)
        if key in sweep.scores:
            # Same weights, same runtime, same kernels (only the scheduler differs): lm-eval and the
            # fidelity windows would compute exactly the same numbers again.
            acc, fidelity, reused_from = sweep.scores[key]
        else:
            acc, fidelity = sweep.scorer.score(engine, ui.stage, name)
            reused_from = None
        server = None
        if isinstance(engine, ServedEngine):
            server = {**engine.described(), "startup_s": engine.startup_s}
        return Measured(bench, acc, fidelity, float(engine.artefact_bytes()), float(engine.weight_bits()),
                        getattr(engine, "build_seconds", None), getattr(engine, "reused", None), reused_from,
                        sweep.scorer.reference, os.getpid(), server)
    finally:
        engine.close()


def _score_more_here(cand: Candidate, reports, sweep, name: str) -> list[AccuracyReport]:
    ui = _quiet_console()
    engine = _built(cand, sweep.cfg, ui, name)
    try:
        return sweep.scorer.score_more(engine, reports, ui.stage, name)
    finally:
        engine.close()


def _built(cand: Candidate, cfg, ui, name: str):
    with ui.stage(f"{name}: building the {cand.recipe.engine} engine"):
        return build_engine(cand, int(cfg.threads), Path(cfg.cache_dir) / "artefacts")


def _level_counter(st, cfg_benchmark):
    """on_level for run_benchmark: levels started so far of those planned, each planned at its warm-up and
    shortest measured window (the rate seen takes over after the first level)."""
    loads = list(cfg_benchmark.rates if cfg_benchmark.get("mode", "closed") == "open" else cfg_benchmark.concurrency)
    per_level = float(cfg_benchmark.get("warmup_s", 0.0)) + float(cfg_benchmark.min_duration_s)
    started = [0]

    def on_level(load):
        st.progress(started[0], len(loads), "levels", planned_s=per_level * len(loads))
        started[0] += 1
    return on_level


def _level_here(build, workload, load, concurrency: int, confidence: float, block: int) -> LevelReport:
    engine = build()
    try:
        return _level_on(engine, workload, load, concurrency, confidence, block)
    finally:
        engine.close()
        gc.collect()


def _level_on(engine, workload, load, concurrency: int, confidence: float, block: int) -> LevelReport:
    server = serve(engine)
    try:
        return run_level(server, workload, concurrency, load, confidence, block)
    finally:
        server.close()


def _soak_here(judge, cand: Candidate, bench, criteria, sweep, name: str, run_id: str) -> list:
    sweep.ui = _quiet_console()
    tracking.attach(str(sweep.cfg.tracking.uri), run_id)   # not ended here: the rung's process owns the run's status
    engine = build_engine(cand, int(sweep.cfg.threads), Path(sweep.cfg.cache_dir) / "artefacts")
    try:
        return judge(engine, bench, criteria, sweep, name)
    finally:
        engine.close()
