"""After the ladder: the three-layer diagnosis of every measured rung and of the champion (its decode step
profiled in a child process), and the sweep's plots."""
from __future__ import annotations

import functools
import logging
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from experiments.analyse import diagnose, profiling, roofline
from experiments.climb.overrides import CONF_DIR
from experiments.climb.sweep import Sweep
from experiments.climb.validation import rung_from
from experiments.core.names import Tag
from experiments.core.recipe import Candidate
from experiments.core.secrets import scrub_text
from experiments.measure import isolation
from experiments.record import plots, tracking
from experiments.record.outcome import RungOutcome
from experiments.serving import build_engine
from experiments.targets.kinds import kind_of
from optimizers.base import Optimizer

log = logging.getLogger(__name__)
RUNGS = Path(CONF_DIR) / "rung"


def diagnose_sweep(outcomes: list[RungOutcome], champion: RungOutcome | None, sweep: Sweep) -> None:
    """The seed's three-layer drill-down (experiments/analyse/diagnose.py): tags `roi.diagnosis` and
    `roi.recommended_next_rung` on every measured rung's run, and on the sweep's run for the champion, whose
    decode step is profiled too; a profiler that fails costs the table, not the sweep."""

    cfg = sweep.cfg
    rules, hardware = cfg.diagnosis, roofline.Hardware.from_conf(cfg.hardware)   # local CPU: measured once, here
    tried, names = {o.name: o.verdict.status for o in outcomes}, [o.name for o in outcomes]
    rung_named = functools.cache(functools.partial(_rung_named, cfg.ladder.get("rungs") or {}))
    client, found = tracking.client(), {}
    for o in outcomes:
        if o.bench is None or o.candidate is None or not o.run_id:
            continue
        try:
            if (alone := _place_on_roofline(o.candidate, cfg.target.workload, hardware, batch=1)) is not None:
                o.decode_floor_ms = alone.decode.min_seconds_per_token * 1e3
                client.log_metric(o.run_id, "roofline/decode_floor_ms_c1", o.decode_floor_ms)
            found[o.name] = diagnose.diagnose(o.bench, _place_on_roofline(o.candidate, cfg.target.workload,
                                              hardware), rules, o.candidate.rungs, tried, names,
                                              _refusal(o, sweep.env, rung_named))
            diagnose.log_to_run(client, o.run_id, found[o.name])
        except Exception as exc:  # noqa: BLE001  (a diagnosis that breaks is recorded, the sweep goes on)
            log.exception("diagnosing %s failed", o.name)
            client.set_tag(o.run_id, Tag.DIAGNOSIS, scrub_text(f"failed: {type(exc).__name__}: {str(exc)[:400]}"))
    if champion is None or champion.name not in found:
        return
    placed = _place_on_roofline(champion.candidate, cfg.target.workload, hardware)
    if placed is None:
        tracking.set_tag(Tag.DIAGNOSIS_MODEL_LAYER, "not placed: the roofline model counts a decoder's layers")
    else:
        _diagnose_model_layer(placed)
    profile = _profile_champion(champion, sweep)
    result = replace(found[champion.name], profile=profile)
    tracking.set_tags(result.tags())
    tracking.log_metrics(result.to_metrics())
    tracking.log_text(result.to_markdown(), "diagnosis/diagnosis.md")
    sweep.ui.note(f"diagnosis of {champion.name}: {result.tag}\n  recommended next rung: {result.next_rung}")


def _rung_named(ladder_rungs, name: str) -> Optimizer | None:
    """The rung as this ladder configures it, else as conf/rung/<rung>.yaml does; None where it cannot be built
    alone (distillation's settings come from the sweep's config)."""
    try:
        return rung_from(name, ladder_rungs.get(name) or OmegaConf.load(RUNGS / f"{name}.yaml"))
    except Exception:  # noqa: BLE001  (a recommendation, not a verdict)
        return None


def _refusal(outcome: RungOutcome, env, rung_named):
    """rung -> why it does not apply to the outcome's candidate, as the rung's own check says after seeing that
    outcome as its champion (a llama.cpp server batches in its own slots; its slots already hold the load's peak),
    or None. A rung that weighs evidence about the model (distillation: is it the bottleneck?) is left to the
    diagnosis, which weighs that evidence; one that cannot tell is not ruled out."""
    def why(name: str) -> str | None:
        opt = rung_named(name)
        if opt is None or opt.weighs_evidence:
            return None
        try:
            opt.observe(outcome)
            return opt.check(env, outcome.candidate)
        except Exception:  # noqa: BLE001  (a recommendation, not a verdict)
            return None
    return why


def _profile_champion(champion: RungOutcome, sweep: Sweep):
    """The champion's decode step under its engine's profiler; None (with the reason tagged) when there is no
    decode step or the profiler fails — that costs the table, not the sweep."""
    if not kind_of(champion.candidate.target.kind).decodes:
        tracking.set_tag(Tag.DIAGNOSIS_FRAMEWORK_PROFILE, "not applicable: the profile is of a decode step, and "
                                                          "an encoder has none")
        return None
    if (engine := champion.candidate.recipe.engine) not in profiling.PROFILED:
        tracking.set_tag(Tag.DIAGNOSIS_FRAMEWORK_PROFILE, f"not applicable: no framework profiler for {engine} here "
                                                          f"(profiled: {', '.join(profiling.PROFILED)})")
        return None
    cfg, rules = sweep.cfg, sweep.cfg.diagnosis
    try:
        with sweep.ui.stage(f"diagnosis: profiling {champion.name}'s decode step"):
            ids = [t for p in sweep.workload.prompts for t in p.token_ids][:int(rules.profile.prompt_tokens)]
            job = (champion.candidate, int(cfg.threads), Path(cfg.cache_dir) / "artefacts", ids,
                   int(rules.profile.decode_steps))
            if not cfg.isolation.enabled:
                profile = _profile_decode(*job)
            else:   # a profiler that crashes costs the table, not the sweep (nor every resume of it)
                done = isolation.run(_profile_decode, job, isolation.Limits.for_rung(cfg.isolation, "diagnosis"),
                                     sweep.logs / "diagnosis-profile.log")
                if done.failure:
                    raise RuntimeError(done.failure)
                profile = done.value
        tracking.log_text(profile.to_markdown(int(rules.profile.top_ops)), "diagnosis/framework_profile.md")
        tracking.log_metrics(profile.to_metrics())
        return profile
    except Exception as exc:  # noqa: BLE001  (the diagnosis says what it could not do)
        log.exception("profiling the champion failed")
        tracking.set_tag(Tag.DIAGNOSIS_FRAMEWORK_PROFILE, f"failed: {type(exc).__name__}: {str(exc)[:400]}")
        return None


def _profile_decode(cand: Candidate, threads: int, artefacts: Path, ids: list[int], steps: int):
    engine = build_engine(cand, threads, artefacts)
    try:
        return profiling.profile_decode(engine, ids, steps)
    finally:
        engine.close()


def _diagnose_model_layer(report) -> None:
    """The champion on the roofline of the configured hardware (the seed's model-layer drill-down)."""
    tracking.log_metrics(report.to_metrics())
    tracking.log_figure(roofline.plot(report), "diagnosis/roofline.png")
    tracking.log_text(report.to_markdown(), "diagnosis/roofline.md")
    tracking.set_tag(Tag.DIAGNOSIS_MODEL_LAYER, report.summary()[:5000])


def sweep_figures(outcomes: list[RungOutcome], champion: RungOutcome | None, cfg: DictConfig) -> dict:
    """The sweep's plots, by the artefact path each is logged at."""
    obj = cfg.gate.objective
    level = int(max(cfg.benchmark.concurrency)) if obj.concurrency == "max" else int(obj.concurrency)
    return {"plots/ladder_waterfall.png": plots.waterfall(outcomes, obj.metric, obj.stat, level),
            "plots/latency_vs_concurrency.png": plots.latency_vs_load(outcomes[0], champion),
            "plots/pareto_latency_accuracy.png": plots.pareto(outcomes, obj.metric, obj.stat, level)}


def _place_on_roofline(cand, workload, hardware, batch: int | None = None):
    """The candidate's model and recipe on `hardware`'s roofline, for the target's longest prompt and context, at
    `batch` decoding sequences (default: the recipe's batch); None where the roofline's counts do not fit the
    target's kind (they count a decoder's layers)."""
    recipe = cand.recipe
    shape = kind_of(cand.target.kind).roofline_shape(cand.target.model_dir)
    if shape is None:
        return None
    return roofline.Roofline.analyse(
        shape, hardware, *roofline.weight_and_kv_bytes(recipe.precision, recipe.quantization),
        prefill_tokens=max(workload.input_tokens), decode_batch=batch or max(1, recipe.max_batch),
        context=max(workload.input_tokens) + max(workload.output_tokens))
