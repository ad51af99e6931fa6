"""Distillation: a student with fewer layers, taught by the champion's model — high cost, so evidence first.

The seed keeps model-structure changes for when the model layer itself is the bottleneck: this rung runs only
when, in the champion's benchmark, model compute dominates end-to-end time, the SLA is still unmet and no resource-layer shape
(experiments/analyse/diagnose.py) points elsewhere (or when `force` says so); otherwise it is skipped with the numbers. The student is an ordinary model folder, so the
champion's recipe (engine, precision, batching, ...) runs it unchanged, and the same gate judges it: on accuracy,
since a retrained model says other things by design. Without an accuracy task there is no bar for it to clear,
so the rung does not run (and a sweep that forces or requires it is refused before any work). The student
learns from the target's own text (experiments/targets/distill_data.py), recorded on the run with its token count.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from experiments.analyse.diagnose import POINTS_AWAY_FROM_MODEL, default_rules, resource_layer
from experiments.core.names import Metric
from experiments.core.recipe import Candidate, Env
from experiments.targets.distill_data import NoTrainingText, Sources, training_text
from experiments.targets.kinds import kind_of
from experiments.targets.models.student import DistillSettings, distill
from optimizers.base import Optimizer

log = logging.getLogger(__name__)
NO_BENCH = "no benchmark of the champion to locate the bottleneck from"
NO_QUALITY_BAR = ("no quality bar: accuracy.tasks is empty, and a distilled student is judged on accuracy alone "
                  "(fidelity and generation agreement do not gate a retrained model)")


@dataclass(frozen=True)
class Evidence:
    """What the champion's benchmark says about the model layer, at its highest measured level."""
    concurrency: int
    model_ms: float            # mean engine compute per request
    e2e_ms: float              # mean end-to-end latency per request
    slos: tuple[str, ...]      # the SLOs measured against
    missed: tuple[str, ...]    # "<slo> at c=<level>" for every miss
    capacity: int | None       # the SLA-capacity search's answer, when it ran
    capacity_ran: bool
    elsewhere: tuple[str, ...] = ()   # resource-layer shapes that point away from the model (diagnose.py)
    resources: str = ""               # every shape the resource layer saw, for the record

    @classmethod
    def from_bench(cls, bench, resource_rules=None) -> "Evidence":
        layer = resource_layer(bench.levels, resource_rules or default_rules().resource)
        away = tuple(f.brief() for f in layer.fired if f.rule in POINTS_AWAY_FROM_MODEL)
        top = bench.levels[-1]
        model, e2e = top.stats.get(Metric.MODEL_MS), top.stats.get(Metric.E2E_MS)
        if model is None or e2e is None:
            raise ValueError(f"the champion's benchmark has no model time at c={top.concurrency} "
                             "(an external endpoint reports none): the bottleneck cannot be located")
        missed = tuple(f"{slo.text} at c={lv.concurrency}" for lv in bench.levels for slo in bench.slos
                       if not slo.met_by(lv))
        cap = bench.capacity
        return cls(top.concurrency, model.mean, e2e.mean, tuple(s.text for s in bench.slos), missed,
                   None if cap is None else cap.concurrency, cap is not None, away,
                   layer.summary() if layer.fired else "")

    @property
    def model_share(self) -> float:
        return self.model_ms / self.e2e_ms if self.e2e_ms > 0 else 0.0

    @property
    def sla_unmet(self) -> bool:
        short = self.capacity_ran and (self.capacity is None or self.capacity < self.concurrency)
        return bool(self.missed) or short

    def describe_share(self) -> str:
        return (f"model compute is {self.model_share:.0%} of mean E2E at c={self.concurrency} "
                f"({self.model_ms:.1f} of {self.e2e_ms:.1f} ms)")

    def describe_sla(self) -> str:
        if not self.slos:
            return "no SLOs are set (benchmark.slos), so nothing says the SLA is unmet"
        if not self.sla_unmet:
            return f"every SLO ({', '.join(self.slos)}) is met at every level up to c={self.concurrency}"
        parts = [f"missed {', '.join(self.missed[:4])}{' ...' if len(self.missed) > 4 else ''}"] if self.missed else []
        if self.capacity_ran and (self.capacity is None or self.capacity < self.concurrency):
            parts.append(f"SLA capacity c={self.capacity} is below the top level c={self.concurrency}")
        return "SLA unmet: " + "; ".join(parts)


class Distillation(Optimizer):
    name = "distillation"
    cost = "high"
    fidelity_gated = False   # a retrained student says other things by design: accuracy judges it

    def __init__(self, student_layers: int | None, steps: int, seq_len: int, batch_size: int, lr: float,
                 temperature: float, alpha: float, seed: int, threads: int, cache_dir: str,
                 stdlib_heldout_every: int | None = None, force: bool = False, model_share_min: float = 0.7,
                 resource_rules=None, accuracy_tasks=(), accuracy_include_path: str | None = None,
                 accuracy_limit: int | None = None, workload_prompts=None, workload_corpus: str | None = None):
        if not 0 < model_share_min <= 1:
            raise ValueError(f"model_share_min must be in (0, 1], got {model_share_min}")
        self.student_layers = student_layers   # null: half the teacher's layers, known once it is seen
        self.settings = DistillSettings(student_layers or 1, steps, seq_len, batch_size, lr, temperature, alpha,
                                        seed)
        self.threads, self.cache_dir = int(threads), Path(cache_dir)
        self.sources = Sources(workload_prompts if isinstance(workload_prompts, str) else None,  # else a count
                               workload_corpus or None, stdlib_heldout_every, tuple(accuracy_tasks or ()),
                               accuracy_include_path, accuracy_limit)
        self.force, self.model_share_min = bool(force), float(model_share_min)
        self.resource_rules = resource_rules   # conf/diagnosis resource thresholds (None: the shipped ones)
        self.evidence: Evidence | None = None
        self.no_evidence = NO_BENCH   # why there is no evidence, while `evidence` is None
        self.decision = ""         # why `check` let it run (forced, or the evidence), for the rung's record
        self.training = None       # distill_data.TrainingText, chosen by `check` when it lets the rung run
        self.result = None         # distill.DistillResult of the last apply

    def config_check(self) -> tuple[str, str] | None:
        if self.sources.tasks:
            return None
        return (NO_QUALITY_BAR, "give it a task to be judged on: accuracy.tasks=[TASK] (and accuracy.include_path=DIR "
                                "for a folder of your own task YAMLs)")

    weighs_evidence = True

    def observe(self, champion) -> None:
        self.evidence, bench = None, getattr(champion, "bench", None)
        if bench is None or not bench.levels:
            self.no_evidence = NO_BENCH
            return
        try:
            self.evidence = Evidence.from_bench(bench, self.resource_rules)
        except ValueError as exc:
            self.no_evidence = str(exc)

    def check(self, env: Env, cand: Candidate) -> str | None:
        self.decision, self.training = "", None
        if not kind_of(cand.target.kind).decodes:
            return (f"distillation here trains a causal-LM student on next-token targets; the target is an encoder "
                    f"({cand.target.kind})")
        if self.name in cand.rungs:
            return "the champion is already a distilled student"
        if no_bar := self.config_check():
            return "; ".join(no_bar)
        teacher_layers = _decoder_layers(cand)
        student_layers = self.student_layers_for(teacher_layers)
        if not teacher_layers or student_layers >= teacher_layers:
            return (f"student_layers={student_layers} is not fewer than the champion's {teacher_layers} decoder "
                    f"layers")
        if self.force:
            seen = f"{self.evidence.describe_share()}; {self.evidence.describe_sla()}" if self.evidence \
                else self.no_evidence
            return self.with_training_text(cand, f"forced (force: true) regardless of the evidence: {seen}")
        if self.evidence is None:
            return self.no_evidence
        ev = self.evidence
        if ev.model_share < self.model_share_min:
            return (f"the model layer is not the bottleneck: {ev.describe_share()}, below model_share_min "
                    f"{self.model_share_min:.0%}; {ev.describe_sla()}")
        if ev.elsewhere:
            return (f"the model layer is not the bottleneck: the resource layer points elsewhere: "
                    f"{'; '.join(ev.elsewhere)} ({ev.describe_share()})")
        if not ev.sla_unmet:
            return f"nothing to gain from a smaller model: {ev.describe_sla()} ({ev.describe_share()})"
        return self.with_training_text(
            cand, f"the model layer is the bottleneck: {ev.describe_share()}; {ev.describe_sla()}" + (
                f"; resource layer: {ev.resources}" if ev.resources else ""))

    def with_training_text(self, cand: Candidate, decision: str) -> str | None:
        """Once the rung would run: the text its student learns from (None), or why there is none."""
        try:
            self.training = training_text(self.sources, Path(cand.target.model_dir))
        except NoTrainingText as exc:
            return str(exc)
        self.decision = f"{decision}; the student learns from {self.training.source}"
        return None

    def student_layers_for(self, teacher_layers: int | None) -> int:
        """student_layers as configured; null: half the teacher's decoder layers (2 of the built-in model's 4,
        15 of SmolLM2's 30)."""
        if self.student_layers is not None:
            return int(self.student_layers)
        return max(1, int(teacher_layers or 0) // 2)

    def resident(self, cand: Candidate) -> Candidate:
        """The teacher: training holds it (the student is smaller), and apply would train."""
        return cand

    def apply(self, cand: Candidate) -> Candidate:
        if self.training is None:   # applied without `check`
            self.training = training_text(self.sources, Path(cand.target.model_dir))
        log.info("the student learns from %s", self.training.source)
        report = self.on_progress
        settings = replace(self.settings, student_layers=self.student_layers_for(_decoder_layers(cand)))
        self.result = distill(Path(cand.target.model_dir), list(self.training.texts), settings, self.cache_dir,
                              self.threads, log.info,
                              (lambda done, total: report(done, total, "distillation", "steps")) if report else None)
        student = replace(cand.target, model_dir=self.result.path)
        return replace(cand.edited(self.name), target=student)

    def applied(self) -> dict[str, str]:
        if self.result is None:
            return {}
        return {"distillation/data_source": self.training.source[:500],
                "distillation/train_texts": str(len(self.training.texts)),
                "distillation/train_tokens": str(self.result.train_tokens)}


def _decoder_layers(cand: Candidate) -> int | None:
    return json.loads((Path(cand.target.model_dir) / "config.json").read_text()).get("num_hidden_layers")
