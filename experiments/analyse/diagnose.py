"""Where is the bottleneck? The field guide's three layers, combined into a diagnosis and a next rung.

    resource layer   the curve-shape table, evaluated on each level's resource samples (ResourceSeries)
    framework layer  mean E2E split into queueing, engine compute and the rest; the decode step's top ops
                     (experiments/analyse/profiling.py)
    model layer      the roofline (experiments/analyse/roofline.py)

`diagnose` reads a BenchmarkReport (and a Roofline when there is one) and names one bottleneck, with the
evidence, and the rung to try next from `conf/diagnosis/next_rung`. A shape narrows the search; it is not a
verdict, and the gate still decides what a rung is worth.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from experiments.core.names import Metric, Tag
from experiments.core.secrets import scrub_text

CONF = Path(__file__).resolve().parents[2] / "conf" / "diagnosis" / "default.yaml"
POINTS_AWAY_FROM_MODEL = ("cpu_side", "memory_capacity", "swinging")


def default_rules():
    return OmegaConf.load(CONF)


# --- the result -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Diagnosis:
    bottleneck: str                  # a key of conf/diagnosis next_rung
    summary: str                     # one line: the evidence for it
    next_rung: str                   # a rung name, or "none"
    next_reason: str
    resources: "ResourceLayer"
    shares: tuple["TimeShare", ...]
    model_layer: str = ""            # the roofline's one-line summary, when there is one
    profile: object | None = None    # profiling.StepProfile, for the champion

    @property
    def tag(self) -> str:
        return f"{self.bottleneck}: {self.summary}"

    def tags(self) -> dict[str, str]:
        return {Tag.DIAGNOSIS: self.tag[:5000], Tag.RECOMMENDED_NEXT_RUNG: self.next_rung,
                Tag.RECOMMENDED_NEXT_RUNG_REASON: self.next_reason[:5000],
                Tag.DIAGNOSIS_RESOURCE_LAYER: self.resources.summary()[:5000]}

    def to_metrics(self) -> dict[str, float]:
        return {f"diagnosis/{k}_share_c{s.concurrency}": v for s in self.shares
                for k, v in (("queue", s.queue), ("model", s.model), ("other", s.other))}

    def to_markdown(self) -> str:
        lines = ["## Diagnosis", "", f"**Bottleneck**: {self.tag}", "",
                 f"**Recommended next rung**: `{self.next_rung}` — {self.next_reason}", "",
                 "### Framework layer: where mean end-to-end time goes", "",
                 "| concurrency | queueing | engine compute | other (server, tokens, client) | mean E2E ms |",
                 "|---|---|---|---|---|"]
        lines += [f"| {s.concurrency} | {s.queue:.0%} | {s.model:.0%} | {s.other:.0%} | {s.e2e_ms:.1f} |"
                  for s in self.shares]
        if not self.shares:
            lines.append("| – | not measured (an external endpoint reports no queue or model time) | | | |")
        lines += ["", self.resources.to_markdown()]
        if self.model_layer:
            lines += ["### Model layer (roofline)", "", self.model_layer, ""]
        if self.profile is not None:
            lines += [self.profile.to_markdown()]
        return "\n".join(lines) + "\n"


def diagnose(bench, roofline=None, rules=None, applied=(), tried=None, ladder=None, refusal=None) -> Diagnosis:
    """The three layers of one configuration's measurements, and what to try next.

    applied: the rungs the configuration already has; tried: rung -> verdict in this sweep (a rejected,
    undecided, skipped or failed rung is not recommended again: it was tried); ladder: this sweep's rungs (a recommendation outside
    it says so); refusal: rung -> why it does not apply to this configuration, or None (a llama.cpp server
    batches in its own slots: no dynamic batching in front of it). Only rungs with a YAML in conf/rung/ are
    recommended."""
    rules = rules or default_rules()
    resources = resource_layer(bench.levels, rules.resource)
    shares = tuple(s for s in (TimeShare.of(lv) for lv in bench.levels) if s is not None)
    bottleneck, summary = _bottleneck(resources, shares, roofline, rules.framework)
    rung, reason = recommend(bottleneck, summary, rules.next_rung, applied, tried or {}, ladder, refusal)
    return Diagnosis(bottleneck, summary, rung, reason, resources, shares,
                     roofline.summary() if roofline is not None else "")


def _bottleneck(resources: "ResourceLayer", shares, roofline, fw) -> tuple[str, str]:
    """The first that holds: memory capacity, CPU-side work, queueing above queue_share_high, saturation;
    else the largest share of E2E: queueing, the model (placed on the roofline), or outside both. The
    resource layer's findings are appended as evidence."""
    fired = {f.rule: f for f in resources.fired}
    top = shares[-1] if shares else None
    split = f" at c={top.concurrency} ({top.describe()})" if top else ""
    also = "; ".join(f.short() for f in resources.fired)
    also = f"; resource layer: {also}" if also else ""
    if "memory_capacity" in fired:
        return "memory_capacity", fired["memory_capacity"].short() + split
    if "cpu_side" in fired:
        return "cpu_side", fired["cpu_side"].short() + split
    if top is not None and top.queue >= fw.queue_share_high:
        return "queueing", f"queueing is {top.queue:.0%} of mean E2E{split}{also}"
    if "saturation" in fired:
        return "saturation", fired["saturation"].short() + split
    dominant = max(("queue", "model", "other"), key=lambda k: getattr(top, k)) if top else "model"
    if dominant == "queue":
        return "queueing", f"queueing is the largest share of mean E2E{split}{also}"
    if dominant == "model":
        where = f"engine compute is {top.model:.0%} of mean E2E{split}" if top else "no queue/model split"
        if roofline is None:
            return "model", where + also
        decode = roofline.decode
        if decode.bound == "compute":
            kind = "compute_bound"
        elif decode.fits_in_cache:
            kind = "overhead"    # memory-bound on paper, but the weights stay in cache: per-step overhead
        else:
            kind = "memory_bound"
        return kind, f"{where}; roofline: {roofline.summary()}{also}"
    return "outside_engine", f"{top.other:.0%} of mean E2E is outside the queue and the engine{split}{also}"


def known_rungs() -> set[str]:
    """Every rung with a YAML in conf/rung/: what a recommendation may name, in this ladder or not."""
    return {p.stem for p in (CONF.parent.parent / "rung").glob("*.yaml")}


def recommend(bottleneck: str, summary: str, table, applied, tried: dict, ladder=None,
              refusal=None) -> tuple[str, str]:
    """The first rung listed for the bottleneck that is neither applied, nor already turned down here, nor
    refused by the configuration (`refusal`: rung -> its reason, or None)."""
    options = list(table.get(bottleneck) or [])
    if not options:
        return "none", (f"no rung of the ladder addresses {bottleneck.replace('_', ' ')}: "
                        + NO_RUNG.get(bottleneck, "look at the evidence"))
    passed, known = [], known_rungs()
    for rung in options:
        if rung in applied:
            passed.append(f"{rung}: applied")
        elif rung not in known:
            passed.append(f"{rung}: no conf/rung/{rung}.yaml")
        elif tried.get(rung) in ("rejected", "undecided", "skipped", "failed"):
            passed.append(f"{rung}: {tried[rung]} in this sweep")
        elif refusal is not None and (why := refusal(rung)):
            passed.append(f"{rung}: does not apply ({why})")
        else:
            note = f" (passed over: {', '.join(passed)})" if passed else ""
            if ladder is not None and rung not in ladder:
                note += f"; not in this ladder: add `/rung@rungs.{rung}: {rung}` to its defaults"
            return rung, f"{bottleneck.replace('_', ' ')} — {summary}{note}"
    return "none", (f"every rung for {bottleneck.replace('_', ' ')} is applied, was turned down or does not apply "
                    f"({', '.join(passed)}): size replicas with the capacity plan, or change the model")


NO_RUNG = {"cpu_side": "move tokenization and pre/post-processing off the serving path, or overlap them",
           "outside_engine": "profile the server and client (tokenization, streaming, Python overhead)"}


# --- framework layer: where the time goes -----------------------------------------------------------------
@dataclass(frozen=True)
class TimeShare:
    concurrency: int
    e2e_ms: float
    queue: float      # shares of mean E2E
    model: float

    @property
    def other(self) -> float:
        return max(0.0, 1.0 - self.queue - self.model)

    @classmethod
    def of(cls, level) -> "TimeShare | None":
        stats = level.stats
        e2e, q, m = (stats.get(k) for k in (Metric.E2E_MS, Metric.QUEUE_MS, Metric.MODEL_MS))
        if e2e is None or q is None or m is None or e2e.mean <= 0:
            return None
        return cls(level.concurrency, float(e2e.mean), float(q.mean) / e2e.mean, float(m.mean) / e2e.mean)

    def describe(self) -> str:
        return f"queue {self.queue:.0%}, model {self.model:.0%}, other {self.other:.0%} of {self.e2e_ms:.1f} ms"


# --- resource layer: the curve-shape table ----------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    rule: str
    shape: str          # the field guide's curve shape
    direction: str      # where it points
    status: str         # fired | clear | not applicable | not sampled
    levels: tuple[int, ...] = ()
    evidence: str = ""

    def brief(self) -> str:
        return f"{self.short()} → {self.direction}"

    def short(self) -> str:
        return f"{self.shape} ({self.evidence})"


@dataclass(frozen=True)
class ResourceLayer:
    findings: tuple[Finding, ...] = field(default=())

    @property
    def fired(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status == "fired")

    def get(self, rule: str) -> Finding:
        return next(f for f in self.findings if f.rule == rule)

    def summary(self) -> str:
        return "; ".join(f.brief() for f in self.fired) or "no curve shape of the table fired"

    def to_markdown(self) -> str:
        rows = ["### Resource layer: the curve-shape table on the sampled data", "",
                "| shape | status | levels | evidence | likely direction |", "|---|---|---|---|---|"]
        rows += [f"| {f.shape} | {f.status} | {', '.join(f'c={c}' for c in f.levels) or '–'} | {f.evidence} "
                 f"| {f.direction} |" for f in self.findings]
        return "\n".join(rows) + "\n"


def resource_layer(levels, r) -> ResourceLayer:
    """Every row of the table, on every level with enough samples: fired, clear, or why it cannot be read."""
    sampled = [lv for lv in levels if getattr(lv, "resources", None) is not None
               and len(lv.resources.cpu_percent) >= r.min_samples]
    accel = [lv for lv in sampled if len(lv.resources.gpu_util) >= r.min_samples]
    no_accel = ("no accelerator sampled" + (f" ({sampled[0].resources.gpu_skipped})"
                                            if sampled and sampled[0].resources.gpu_skipped else ""))
    rules = [_cpu_side(accel, r, no_accel), _cpu_saturated(sampled, r, bool(accel)), _accel_busy(accel, r, no_accel),
             _memory_capacity(sampled, accel, r), _swinging(sampled, r, bool(accel)), _saturation(levels, r),
             Finding("bandwidth", "memory bandwidth saturated, SM low", "memory-bound (LLM decode)", "not sampled",
                     evidence="NVML gives no DRAM bandwidth or SM occupancy (DCGM / Nsight do); the roofline's "
                              "bound stands in for it"),
             Finding("interconnect", "network / PCIe spikes", "multi-device communication or H2D/D2H copies",
                     "not sampled", evidence="one device, in process: nothing crosses a link that is sampled")]
    if not sampled:
        rules = [f if f.rule == "saturation" or f.status == "not sampled" else
                 Finding(f.rule, f.shape, f.direction, "not sampled",
                         evidence=f"fewer than {r.min_samples} resource samples per level") for f in rules]
    return ResourceLayer(tuple(rules))


def _cpu_fraction(series) -> float:
    return float(np.mean(series.cpu_percent)) / 100.0 / max(1, series.cpu_count)


def _finding(rule, shape, direction, hits: dict[int, str], applicable: str = "") -> Finding:
    if applicable:
        return Finding(rule, shape, direction, "not applicable", evidence=applicable)
    if not hits:
        return Finding(rule, shape, direction, "clear")
    text = "; ".join(f"c={c}{t}" if t.startswith("→") else f"c={c}: {t}" for c, t in hits.items())
    return Finding(rule, shape, direction, "fired", tuple(hits), text)


def _cpu_side(accel, r, no_accel) -> Finding:
    hits = {lv.concurrency: f"GPU {np.mean(lv.resources.gpu_util):.0f} %, CPU {_cpu_fraction(lv.resources):.0%}"
            for lv in accel if np.mean(lv.resources.gpu_util) < r.accel_low
            and _cpu_fraction(lv.resources) >= r.cpu_high}
    return _finding("cpu_side", "accelerator util low, CPU high",
                    "CPU-side preprocessing, tokenizer, data loading or post-processing", hits,
                    "" if accel else f"{no_accel}: the model runs on the CPU, so CPU load is its own compute and "
                                     "this shape cannot separate it from pre/post-processing (the E2E split can)")


def _cpu_saturated(sampled, r, has_accel: bool) -> Finding:
    hits = {lv.concurrency: f"CPU {_cpu_fraction(lv.resources):.0%} of {lv.resources.cpu_count} cores"
            for lv in sampled if lv.concurrency <= r.low_concurrency and _cpu_fraction(lv.resources) >= r.cpu_saturated}
    direction = ("the host: per-step launch and Python overhead (CUDA Graph, a compiled engine)" if has_accel else
                 "compute-bound on the CPU: every core is busy already, more clients only queue; cheaper compute "
                 "per token (engine, quantization) or more replicas")
    return _finding("cpu_saturated", "CPU saturated across cores at low concurrency", direction, hits)


def _accel_busy(accel, r, no_accel) -> Finding:
    hits = {lv.concurrency: f"GPU {np.mean(lv.resources.gpu_util):.0f} %" for lv in accel
            if np.mean(lv.resources.gpu_util) >= r.accel_high}
    return _finding("accel_busy", "accelerator util high, QPS below expectation",
                    "inefficient kernels or a config that recomputes (compare with the roofline's bound)", hits,
                    "" if accel else no_accel)


def _memory_capacity(sampled, accel, r) -> Finding:
    hits = {}
    for lv in accel:
        s = lv.resources
        if s.gpu_mem_total_mb and np.mean(s.gpu_util) < r.accel_low \
                and max(s.gpu_mem_mb) / s.gpu_mem_total_mb >= r.memory_near_full:
            hits[lv.concurrency] = f"GPU {np.mean(s.gpu_util):.0f} %, memory {max(s.gpu_mem_mb) / s.gpu_mem_total_mb:.0%}"
    if not accel:   # CPU-only: the host's memory is the model's memory
        hits = {lv.concurrency: f"host memory {max(lv.resources.host_mem_percent):.0f} %" for lv in sampled
                if lv.resources.host_mem_percent and max(lv.resources.host_mem_percent) / 100 >= r.memory_near_full}
    return _finding("memory_capacity", "accelerator util low, memory near full" if accel else
                    "memory near full (host memory: CPU-only run)", "capacity: swapping or OOM retries", hits)


def _swinging(sampled, r, has_accel: bool) -> Finding:
    hits = {}
    for lv in sampled:
        xs = np.asarray(lv.resources.gpu_util if has_accel else lv.resources.cpu_percent, float)
        mean = float(xs.mean())
        if mean >= r.swing_min_mean and xs.std() / mean > r.swing_cv:
            hits[lv.concurrency] = f"{'GPU' if has_accel else 'CPU'} util mean {mean:.0f} %, CV {xs.std() / mean:.2f}"
    return _finding("swinging", "utilisation swinging", "queueing, cold start or a batch window mismatch", hits)


def _saturation(levels, r) -> Finding:
    pts = [(lv.concurrency, lv.qps, lv.stats[Metric.E2E_MS].mean) for lv in levels
           if getattr(lv, "qps", None) and lv.stats.get(Metric.E2E_MS) is not None]
    hits = {a[0]: f"→{b[0]}: throughput ×{b[1] / a[1]:.2f}, mean E2E ×{b[2] / a[2]:.2f}"
            for a, b in zip(pts, pts[1:]) if b[1] / a[1] < r.flat_gain and b[2] / a[2] >= r.latency_growth}
    if len(pts) < 2:
        return Finding("saturation", "throughput flat while latency grows", "saturation", "not sampled",
                       evidence="needs two levels or more")
    return _finding("saturation", "throughput flat while latency grows",
                    "saturation: the server is at capacity, more load only waits (batching or replicas)", hits)


# --- for the sweep ----------------------------------------------------------------------------------------

def log_to_run(client, run_id: str, diagnosis: Diagnosis) -> None:
    """Tags, shares and diagnosis/diagnosis.md on a (finished) rung run."""
    for key, value in diagnosis.tags().items():
        client.set_tag(run_id, key, scrub_text(value))
    for key, value in diagnosis.to_metrics().items():
        client.log_metric(run_id, key, value)
    client.log_text(run_id, scrub_text(diagnosis.to_markdown()), "diagnosis/diagnosis.md")
