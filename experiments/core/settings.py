"""Every numeric setting in conf/, its type and its range, in one table checked before any work.

A range is written as an interval: `[1, inf)`, `(0, 1)`, `[0, benchmark.max_duration_s]`; a bound may name
another setting. `*` in a key stands for every entry of a mapping (per-rung limits). A key the composed config
lacks is not checked (each target kind has its own workload keys)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.core.errors import ConfigError
from experiments.core.names import LATENCY_METRICS

STATS = ("mean", "p50", "p95", "p99")      # what a latency series is summarised by (experiments/core/stats.py)

ABSENT = object()
INTERVAL = re.compile(r"^(?P<open_low>[\[(])\s*(?P<low>[^,]+?)\s*,\s*(?P<high>[^,]+?)\s*(?P<open_high>[\])])$")


@dataclass(frozen=True)
class Setting:
    key: str
    kind: type              # int or float; an int is a float too, a bool is neither
    interval: str
    hint: str
    nullable: bool = False  # null is a value of its own (e.g. "no limit", "measure it")
    many: bool = False      # a non-empty list of such values
    or_file: bool = False   # a string is a file's path instead, read and checked by its own reader
    choices: tuple = ()     # a word setting (kind str): one of these; no interval


def one_of(key: str, choices: tuple) -> Setting:
    return Setting(key, str, "", f"use one of {choices}", choices=choices)


POSITIVE, NON_NEGATIVE, AT_LEAST_ONE, SHARE = "(0, inf)", "[0, inf)", "[1, inf)", "[0, 1]"

SETTINGS = (
    Setting("threads", int, AT_LEAST_ONE, "set threads to the cores the engine under test may use, e.g. threads=2"),
    Setting("seed", int, NON_NEGATIVE, "e.g. seed=0"),
    # --- load
    Setting("benchmark.max_concurrency", int, AT_LEAST_ONE,
            "give the most clients one level may open, e.g. benchmark.max_concurrency=1024"),
    Setting("benchmark.concurrency", int, "[1, benchmark.max_concurrency]",
            "e.g. benchmark.concurrency=[1,2,4]; each client is a thread holding requests in memory, so a level "
            "above benchmark.max_concurrency would exhaust the machine before the engine is measured (raise "
            "benchmark.max_concurrency where it can hold more)", many=True),
    Setting("benchmark.rates", float, POSITIVE, "e.g. benchmark.rates=[2,4,8] (requests/s)", many=True),
    Setting("benchmark.warmup_requests", int, NON_NEGATIVE, "e.g. benchmark.warmup_requests=8"),
    Setting("benchmark.warmup_s", float, NON_NEGATIVE, "e.g. benchmark.warmup_s=0"),
    Setting("benchmark.min_requests", int, AT_LEAST_ONE, "e.g. benchmark.min_requests=32"),
    Setting("benchmark.max_duration_s", float, POSITIVE, "e.g. benchmark.max_duration_s=120"),
    Setting("benchmark.min_duration_s", float, "[0, benchmark.max_duration_s]",
            "e.g. benchmark.min_duration_s=10 (seconds per level, at most benchmark.max_duration_s)"),
    Setting("benchmark.request_timeout_s", float, POSITIVE, "e.g. benchmark.request_timeout_s=30"),
    Setting("benchmark.gamma_shape", float, POSITIVE, "e.g. benchmark.gamma_shape=1.0 (Poisson)"),
    Setting("benchmark.seed", int, NON_NEGATIVE, "e.g. benchmark.seed=0 (default: seed)"),
    # --- the workload (target.workload.prompts: a count of synthetic prompts, or the user's JSONL file)
    Setting("target.workload.prompts", int, AT_LEAST_ONE,
            "give the number of prompts to draw, e.g. target.workload.prompts=256, or a JSONL prompts file",
            nullable=True, or_file=True),
    Setting("target.workload.requests", int, AT_LEAST_ONE, "e.g. target.workload.requests=256"),
    Setting("target.workload.input_tokens", int, AT_LEAST_ONE, "e.g. target.workload.input_tokens=[16,48,96]",
            many=True),
    Setting("target.workload.output_tokens", int, AT_LEAST_ONE, "e.g. target.workload.output_tokens=[16,32,64]",
            many=True),
    Setting("target.workload.shared_prefix_tokens", int, NON_NEGATIVE, "0 for none, e.g. 64"),
    Setting("target.workload.texts", int, AT_LEAST_ONE, "e.g. target.workload.texts=400"),
    Setting("target.workload.seed", int, NON_NEGATIVE, "e.g. target.workload.seed=1"),
    Setting("target.workload.max_tokens", int, AT_LEAST_ONE, "e.g. target.workload.max_tokens=128"),
    Setting("target.scoring.queries", int, AT_LEAST_ONE, "e.g. target.scoring.queries=600"),
    Setting("target.agreement.prompts", int, AT_LEAST_ONE, "e.g. target.agreement.prompts=32"),
    Setting("target.agreement.tokens", int, AT_LEAST_ONE, "e.g. target.agreement.tokens=16"),
    Setting("target.agreement.min_share", float, SHARE,
            "give the share of prompts whose greedy answer must match the baseline's up to near-ties, e.g. 0.5"),
    Setting("target.agreement.near_tie", float, POSITIVE,
            "give the baseline's margin in nats below which a flipped token is a near-tie, e.g. 1.0"),
    Setting("target.distillation.steps", int, AT_LEAST_ONE, "e.g. target.distillation.steps=40"),
    Setting("target.distillation.batch_size", int, AT_LEAST_ONE, "e.g. target.distillation.batch_size=4"),
    Setting("target.distillation.stdlib_heldout_every", int, "[2, inf)",
            "every Nth stdlib file held out, e.g. 8; null: the student learns from the target's own text",
            nullable=True),
    Setting("target.scoring.recall_at", int, AT_LEAST_ONE, "e.g. target.scoring.recall_at=[1,5]", many=True),
    Setting("target.scoring.batch_size", int, AT_LEAST_ONE, "e.g. target.scoring.batch_size=32"),
    Setting("target.scoring.min_cosine_mean", float, "[-1, 1]", "a cosine, e.g. 0.99"),
    Setting("target.scoring.min_cosine_min", float, "[-1, 1]", "a cosine, e.g. 0.95"),
    # --- accuracy and the gate
    Setting("accuracy.limit", int, AT_LEAST_ONE, "null scores every document, e.g. accuracy.limit=200",
            nullable=True),
    Setting("accuracy.first_look", int, AT_LEAST_ONE, "null looks once at every document, e.g. "
            "accuracy.first_look=400", nullable=True),
    Setting("accuracy.batch_size", int, AT_LEAST_ONE, "e.g. accuracy.batch_size=32"),
    one_of("gate.objective.metric", LATENCY_METRICS),
    one_of("gate.objective.stat", STATS),
    one_of("benchmark.mode", ("closed", "open")),
    Setting("gate.min_gain", float, "[0, 1)", "give the share a challenger must beat the champion by: 0.05 asks "
                                              "for 5 % faster; 1 or more would ask for a zero or negative latency"),
    Setting("gate.confidence", float, "(0, 1)", "give a confidence level such as 0.95"),
    Setting("gate.bootstrap_resamples", int, AT_LEAST_ONE, "e.g. gate.bootstrap_resamples=2000"),
    Setting("gate.interleaved.rounds", int, NON_NEGATIVE, "0 compares with the recorded run; e.g. 20"),
    Setting("gate.interleaved.max_rounds", int, AT_LEAST_ONE, "null looks once; e.g. 32: while undecided, "
            "`rounds` more at a time up to 32", nullable=True),
    Setting("gate.interleaved.budget_s", float, POSITIVE, "null: no time limit on added looks; e.g. 60",
            nullable=True),
    Setting("gate.interleaved.seconds", float, POSITIVE, "give the length of each run in a round, e.g. 2.0"),
    Setting("gate.interleaved.min_requests", int, AT_LEAST_ONE, "give the fewest requests per run, e.g. 40"),
    Setting("gate.memory.min_saving", float, "(0, 1)", "give the share of memory a rung aiming at memory must save, "
            "e.g. 0.10"),
    Setting("gate.memory.max_slowdown", float, "[0, 1)", "give the slowdown a rung aiming at memory may cost at "
            "most, e.g. 0.05 (its speed ratio's upper bound below 1.05)"),
    Setting("gate.consistency.max_deviation", float, POSITIVE,
            "e.g. gate.consistency.max_deviation=0.25 (each side in the rounds within 25 % of its own recorded run)"),
    Setting("gate.accuracy.max_drop_abs", float, NON_NEGATIVE, "null to leave it unused, e.g. 0.02",
            nullable=True),
    Setting("gate.accuracy.max_drop_rel", float, SHARE, "null to leave it unused; 0.05 tolerates a 5 % drop",
            nullable=True),
    Setting("gate.fidelity.sequences", int, AT_LEAST_ONE, "e.g. gate.fidelity.sequences=32"),
    Setting("gate.fidelity.length", int, AT_LEAST_ONE, "e.g. gate.fidelity.length=128"),
    Setting("gate.fidelity.max_kl", float, NON_NEGATIVE, "in nats per position, e.g. 0.01"),
    Setting("gate.fidelity.min_top1", float, SHARE, "a share of positions, e.g. 0.90"),
    # --- isolation
    Setting("isolation.time_limit_s", float, POSITIVE, "e.g. isolation.time_limit_s=3600"),
    Setting("isolation.memory_limit_gb", float, POSITIVE,
            "null takes isolation.memory_fraction of this machine's RAM, e.g. isolation.memory_limit_gb=16",
            nullable=True),
    Setting("isolation.memory_fraction", float, "(0, 1]",
            "e.g. isolation.memory_fraction=0.8, or set isolation.memory_limit_gb"),
    Setting("isolation.poll_s", float, POSITIVE, "e.g. isolation.poll_s=0.2"),
    Setting("isolation.rungs.*.time_limit_s", float, POSITIVE, "e.g. 7200"),
    Setting("isolation.rungs.*.memory_limit_gb", float, POSITIVE, "e.g. 16, or null for the default",
            nullable=True),
    # --- soak
    Setting("soak.duration_s", float, POSITIVE, "e.g. soak.duration_s=1800"),
    Setting("soak.warmup_s", float, NON_NEGATIVE, "e.g. soak.warmup_s=240"),
    Setting("soak.window_s", float, POSITIVE, "e.g. soak.window_s=10"),
    Setting("soak.request_timeout_s", float, POSITIVE, "e.g. 30"),
    Setting("soak.horizon_h", float, POSITIVE, "e.g. soak.horizon_h=24"),
    Setting("soak.budget_mb", float, POSITIVE, "e.g. soak.budget_mb=64"),
    Setting("soak.max_drift", float, NON_NEGATIVE, "e.g. soak.max_drift=0.10"),
    Setting("soak.drift_windows", int, AT_LEAST_ONE, "e.g. soak.drift_windows=3"),
    Setting("soak.max_error_rate", float, SHARE, "a share of requests, e.g. soak.max_error_rate=0.01"),
    Setting("soak.confidence", float, "(0, 1)", "e.g. soak.confidence=0.95 (default: gate.confidence)"),
    Setting("soak.bootstrap_resamples", int, AT_LEAST_ONE, "e.g. 2000 (default: gate.bootstrap_resamples)"),
    Setting("soak.seed", int, NON_NEGATIVE, "e.g. soak.seed=0 (default: seed)"),
    # --- capacity
    Setting("capacity.peak_qps", float, POSITIVE, "e.g. capacity.peak_qps=200"),
    Setting("capacity.headroom", float, "[1, 3]", "the seed uses 1.2-1.5, e.g. capacity.headroom=1.3"),
    Setting("capacity.price_per_replica_hour", float, NON_NEGATIVE, "e.g. capacity.price_per_replica_hour=4.0"),
    Setting("capacity.autoscaling.scale_up_fraction", float, "(0, 1]", "e.g. 0.8"),
    Setting("capacity.autoscaling.scale_down_fraction", float, "[0, 1)", "e.g. 0.3"),
    Setting("capacity.autoscaling.scale_up_for_s", float, NON_NEGATIVE, "e.g. 30"),
    Setting("capacity.autoscaling.scale_down_for_s", float, NON_NEGATIVE, "e.g. 180"),
    # --- diagnosis and the roofline
    *(Setting(f"diagnosis.resource.{k}", float, SHARE, "a share, e.g. 0.6")
      for k in ("cpu_high", "cpu_saturated", "memory_near_full")),
    *(Setting(f"diagnosis.resource.{k}", float, "[0, 100]", "a utilisation in %, e.g. 40")
      for k in ("accel_low", "accel_high")),
    Setting("diagnosis.resource.min_samples", int, AT_LEAST_ONE, "e.g. 4"),
    Setting("diagnosis.resource.low_concurrency", float, NON_NEGATIVE, "e.g. 2"),
    Setting("diagnosis.resource.swing_cv", float, NON_NEGATIVE, "e.g. 0.35"),
    Setting("diagnosis.resource.swing_min_mean", float, "[0, 100]", "a utilisation in %, e.g. 10"),
    Setting("diagnosis.resource.flat_gain", float, POSITIVE, "a ratio, e.g. 1.10"),
    Setting("diagnosis.resource.latency_growth", float, POSITIVE, "a ratio, e.g. 1.50"),
    Setting("diagnosis.framework.queue_share_high", float, SHARE, "a share of mean E2E, e.g. 0.5"),
    Setting("diagnosis.profile.prompt_tokens", int, AT_LEAST_ONE, "e.g. 48"),
    Setting("diagnosis.profile.decode_steps", int, AT_LEAST_ONE, "e.g. 16"),
    Setting("diagnosis.profile.top_ops", int, AT_LEAST_ONE, "e.g. 12"),
    Setting("tracking.ui_port", int, "[0, 65535]", "a TCP port, e.g. tracking.ui_port=5000"),
    Setting("hardware.peak_flops", float, POSITIVE, "FLOP/s, or null to measure", nullable=True),
    Setting("hardware.peak_bandwidth", float, POSITIVE, "bytes/s, or null to measure", nullable=True),
    Setting("hardware.cache_bytes", float, POSITIVE, "bytes, or null to read it from /sys", nullable=True),
    Setting("hardware.seconds", float, POSITIVE, "e.g. hardware.seconds=1.0"),
    Setting("hardware.matmul_size", int, AT_LEAST_ONE, "e.g. 1024"),
    Setting("hardware.copy_bytes", int, AT_LEAST_ONE, "e.g. 268435456"),
    Setting("hardware.memory_bytes", float, POSITIVE, "bytes, or null for what the device has free", nullable=True),
)


def check_settings(cfg: DictConfig, *prefixes: str) -> None:
    """A ConfigError for the first setting (of all, or those under these prefixes) of the wrong type or out of
    its range."""
    _check_all(Scope(cfg), prefixes or ("",))


def check_section(section: DictConfig, name: str) -> None:
    """The same for one section on its own (cfg.soak as `soak`), as its module's check_config receives it."""
    _check_all(Scope(section, f"{name}."), (f"{name}.",))


@dataclass(frozen=True)
class Scope:
    """Where full keys (`soak.window_s`) are looked up: the whole config, or one section of it."""
    node: DictConfig
    prefix: str = ""

    def select(self, key: str):
        if not key.startswith(self.prefix):
            return ABSENT   # outside this section: a row whose range names one belongs in check_settings
        try:
            return OmegaConf.select(self.node, key[len(self.prefix):], default=ABSENT,
                                    throw_on_resolution_failure=True)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{key} cannot be resolved ({' '.join(str(exc).split())})",
                              f"give {key} a value, or fix the interpolation it names") from None


def _check_all(scope: Scope, prefixes: tuple[str, ...]) -> None:
    for setting in SETTINGS:
        if setting.key.startswith(prefixes):
            for key in _expand(scope, setting.key):
                _check(scope, setting, key)


def _expand(scope: Scope, pattern: str) -> list[str]:
    if "*" not in pattern:
        return [pattern]
    head, _, tail = pattern.partition(".*.")
    entries = scope.select(head)
    return [f"{head}.{name}.{tail}" for name in entries] if isinstance(entries, DictConfig) else []


def _check(scope: Scope, setting: Setting, key: str) -> None:
    value = scope.select(key)
    if value is ABSENT or (value is None and setting.nullable) or (setting.or_file and isinstance(value, str)):
        return
    if setting.choices:
        if value not in setting.choices:
            raise ConfigError(f"{key} {_shown(value)} is unknown", setting.hint)
        return
    bounds = INTERVAL.match(setting.interval)
    low, high = _bound(scope, bounds["low"]), _bound(scope, bounds["high"])
    if math.isnan(low) or math.isnan(high):
        raise ConfigError(f"the range of {key} ({setting.interval}) names a setting that is missing",
                          f"set {', '.join(b for b in (bounds['low'], bounds['high']) if not _numeric(b))}")
    wanted = f"{_kind_words(setting)} {_range_words(setting.interval, low, high)}"
    values = list(value) if setting.many and isinstance(value, ListConfig) else None
    if setting.many:
        if not values or not all(_fits(v, setting.kind, low, high, setting.interval) for v in values):
            raise ConfigError(f"{key} must list {wanted}, got {_shown(value)}", setting.hint)
    elif not _fits(value, setting.kind, low, high, setting.interval):
        raise ConfigError(f"{key}={_shown(value)} is not {wanted}", setting.hint)


def _bound(scope: Scope, text: str) -> float:
    if _numeric(text):
        return float(text)
    value = scope.select(text)   # another setting, checked by its own row (earlier in the table)
    return float(value) if _is_number(value) else math.nan


def _fits(value, kind: type, low: float, high: float, interval: str) -> bool:
    if not _is_number(value) or (kind is int and not isinstance(value, int)) or not math.isfinite(value):
        return False
    above = value > low if interval.startswith("(") else value >= low
    below = value < high if interval.endswith(")") else value <= high
    return above and below


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind_words(setting: Setting) -> str:
    noun = "integer" if setting.kind is int else "number"
    words = f"{noun}s" if setting.many else f"{'an' if noun == 'integer' else 'a'} {noun}"
    return f"{words} (or null)" if setting.nullable else words


def _range_words(interval: str, low: float, high: float) -> str:
    parts = INTERVAL.match(interval)
    named = [b for b in (parts["low"], parts["high"]) if not _numeric(b)]
    if math.isinf(high):
        words = f"{'>' if parts['open_low'] == '(' else '>='} {low:g}"
    else:
        words = f"in {parts['open_low']}{low:g}, {high:g}{parts['open_high']}"
        if parts["open_low"] == "[" and parts["open_high"] == "]" and named:
            words = f">= {low:g} and <= {high:g}"
    return f"{words} ({', '.join(named)})" if named else words


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _shown(value) -> str:
    if isinstance(value, (ListConfig, DictConfig)):
        return str(OmegaConf.to_container(value, resolve=False))
    return repr(value) if isinstance(value, str) else str(value)
