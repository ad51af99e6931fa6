"""Soak: hold the challenger at one concurrency for a long time, then judge leaks, drift and errors from numbers.

The load is benchmark's closed loop, run one window at a time so that each window's requests can be reduced to
a row of the time series and dropped: the harness itself must not grow, or its own records would read as a leak.
A window ends when its last requests have finished, so it runs a little past window_s (QPS is over its real length).
The warm-up windows are kept in the table and the plot but cut off before any fit.
- leak: growth that persists, after the series settles, judged with its interval (experiments/judge/leak.py):
  clean, LEAK, or not decided by a soak this short; a declared cache cap is not extrapolated past.
- drift: P95 E2E of the last k windows over the first k, bootstrap interval; flagged when its lower bound
  exceeds 1 + max_drift.
- errors: errors and timeouts over requests in the measured windows, against max_error_rate.
"""
from __future__ import annotations

import csv
import io
import math
import time
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np
import psutil
from matplotlib.figure import Figure

from experiments.core.errors import ConfigError
from experiments.core.settings import check_section
from experiments.core.stats import ratio_ci
from experiments.judge.gate import Criterion
from experiments.judge.leak import decided, leak_check
from experiments.measure.load import closed_loop, still_serving
from experiments.measure.resources import ResourceSampler
from experiments.targets.workload import SOAK, Workload


# --- validation before any long work ---------------------------------------------------------------------
def check_config(cfg) -> None:
    """Bad soak settings fail here, before a sweep has built anything."""
    check_section(cfg, "soak")   # types and ranges; what follows relates the settings to each other
    if cfg.duration_s <= cfg.warmup_s:
        raise ConfigError(f"soak.duration_s={cfg.duration_s} is not longer than its warm-up soak.warmup_s="
                          f"{cfg.warmup_s}: what is left after the warm-up would be too short to judge",
                          "make soak.duration_s longer than soak.warmup_s (production: 1800 s after 240 s)")
    if cfg.window_s > cfg.duration_s:
        raise ConfigError(f"soak.window_s={cfg.window_s} is longer than soak.duration_s={cfg.duration_s}",
                          "use windows a fraction of the duration, e.g. soak.window_s=10")
    need = max(2 * int(cfg.drift_windows), 3)
    if math.floor(cfg.duration_s / cfg.window_s + 1e-9) < need:
        raise ConfigError(f"soak.duration_s / soak.window_s gives {int(cfg.duration_s // cfg.window_s)} windows; "
                          f"the drift check compares the first and last {cfg.drift_windows} and the leak fit "
                          f"needs 3, so at least {need}",
                          "lengthen soak.duration_s, shorten soak.window_s or lower soak.drift_windows")
    level = cfg.concurrency
    if level != "sla" and not (isinstance(level, int) and not isinstance(level, bool) and level >= 1):
        raise ConfigError(f"soak.concurrency={level!r} is neither `sla` nor an integer >= 1",
                          "use soak.concurrency=sla (the challenger's SLA capacity) or e.g. soak.concurrency=8")


def concurrency_for(setting, capacity, fallback: int) -> tuple[int, str]:
    """(clients, why): the SLA-capacity concurrency when the search found one, else the gate's objective level."""
    if setting != "sla":
        return int(setting), "configured"
    if capacity is not None and capacity.concurrency:
        return int(capacity.concurrency), "SLA capacity"
    return int(fallback), "the gate's objective level (no SLA capacity measured)"


# --- the time series --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    start_s: float                   # since the soak began
    duration_s: float
    warmup: bool
    requests: int
    errors: int                      # errors and timeouts
    p95_e2e_ms: float | None         # None when no request succeeded
    qps: float                       # successful requests/s
    rss_mb: float                    # median of the samples in the window: the level a leak raises
    rss_mb_peak: float               # the watermark
    gpu_mem_mb: float | None = None  # NVML, device memory used (median), when a CUDA device is present

    @property
    def mid_s(self) -> float:
        return self.start_s + self.duration_s / 2


def window_counts(cfg) -> tuple[int, int]:
    """(warm-up windows, measured windows)."""
    return math.ceil(cfg.warmup_s / cfg.window_s - 1e-9), math.floor(cfg.duration_s / cfg.window_s + 1e-9)


def run_soak(server, workload: Workload, cfg, concurrency: int, on_window=lambda w: None,
             bound_mb: float | None = None) -> "SoakReport":
    """warmup_s + duration_s of closed-loop load at `concurrency`, in windows of window_s; `bound_mb`: the cap of
    the engine's cache, where it declares one (ServedEngine.bounded_cache_mb)."""
    n_warm, n_measured = window_counts(cfg)
    k = int(cfg.drift_windows)
    first: list[np.ndarray] = []                 # e2e of the first k measured windows
    last: deque[np.ndarray] = deque(maxlen=k)    # and of the last k: bounded, whatever the duration
    requests, sent, windows, gpu_note = workload.requests(SOAK), 0, [], ""
    began = time.perf_counter()
    for i in range(n_warm + n_measured):
        # a serving engine's leak is in its server's processes, not in this client
        with ResourceSampler(min(0.25, cfg.window_s / 8), processes=getattr(server, "processes", None)) as res:
            start = time.perf_counter()
            records = closed_loop(server, requests.after(sent), concurrency, 0, cfg.window_s,
                                   cfg.window_s, cfg.request_timeout_s)
            took = time.perf_counter() - start
        still_serving(server, f"during the soak's window {i + 1}")
        sent += len(records)
        e2e = np.array([(r.token_times[-1] - r.arrival) * 1e3 for r in records if r.ok])
        rss = res.rss_mb or [psutil.Process().memory_info().rss / 2**20]
        window = Window(start_s=start - began, duration_s=took, warmup=i < n_warm, requests=len(records),
                        errors=sum(not r.ok for r in records),
                        p95_e2e_ms=float(np.percentile(e2e, 95)) if e2e.size else None, qps=e2e.size / took,
                        rss_mb=float(np.median(rss)), rss_mb_peak=float(max(rss)),
                        gpu_mem_mb=float(np.median(res.gpu_mem_mb)) if res.gpu_mem_mb else None)
        del records
        gpu_note = res.gpu_skipped
        windows.append(window)
        on_window(window)
        if not window.warmup:
            if len(first) < k:
                first.append(e2e)
            last.append(e2e)
    return SoakReport.judge(tuple(windows), concurrency, first, list(last), cfg, gpu_note, bound_mb)


# --- the verdicts -----------------------------------------------------------------------------------------
def drift_check(first_ms, last_ms, max_drift: float, confidence: float, resamples: int, seed: int) -> Criterion:
    """P95 E2E of the last windows over the first ones; drift when the ratio's lower bound exceeds 1 + max_drift."""
    a, b = np.asarray(last_ms, float), np.asarray(first_ms, float)
    if a.size < 2 or b.size < 2:
        return Criterion("drift", False, f"drift: too few successful requests to compare ({b.size} first, "
                                         f"{a.size} last)")
    ratio, low, high = ratio_ci(a, b, "p95", confidence, resamples, seed)
    limit = 1 + max_drift
    drifting = low > limit
    detail = (f"P95 E2E last/first ×{ratio:.3f} [{low:.3f}, {high:.3f}] "
              f"{'>' if drifting else 'not surely >'} {limit:.2f}{': DRIFT' if drifting else ''}")
    return Criterion("drift", not drifting, detail, {"ratio": ratio, "ratio_ci_low": low, "ratio_ci_high": high,
                                                     "ratio_limit": limit, "n_first": float(b.size),
                                                     "n_last": float(a.size)})


def error_check(errors: int, requests: int, max_rate: float) -> Criterion:
    if requests == 0:
        return Criterion("errors", False, "errors: no request finished after the warm-up")
    rate = errors / requests
    passed = rate <= max_rate
    return Criterion("errors", passed, f"errors {errors}/{requests} ({rate:.2%}) {'<=' if passed else '>'} "
                                       f"{max_rate:.2%}", {"rate": rate, "errors": float(errors),
                                                           "requests": float(requests), "max_rate": max_rate})


@dataclass(frozen=True)
class SoakReport:
    concurrency: int
    windows: tuple[Window, ...]
    checks: tuple[Criterion, ...]
    gpu_note: str = ""               # why GPU memory is absent, if it is

    @classmethod
    def judge(cls, windows, concurrency, first_ms, last_ms, cfg, gpu_note="", bound_mb=None) -> "SoakReport":
        measured = [w for w in windows if not w.warmup]
        t = [w.mid_s for w in measured]
        checks = [leak_check("leak_rss", t, [w.rss_mb for w in measured], cfg.horizon_h, cfg.budget_mb,
                             cfg.confidence, bound_mb, psutil.virtual_memory().total / 2**20)]
        if all(w.gpu_mem_mb is not None for w in measured):
            checks.append(leak_check("leak_gpu", t, [w.gpu_mem_mb for w in measured], cfg.horizon_h,
                                     cfg.budget_mb, cfg.confidence))
        checks.append(drift_check(np.concatenate(first_ms or [[]]), np.concatenate(last_ms or [[]]),
                                  cfg.max_drift, cfg.confidence, int(cfg.bootstrap_resamples), int(cfg.seed)))
        checks.append(error_check(sum(w.errors for w in measured), sum(w.requests for w in measured),
                                  cfg.max_error_rate))
        return cls(concurrency, tuple(windows), tuple(checks), gpu_note)

    @property
    def measured_s(self) -> float:
        return sum(w.duration_s for w in self.windows if not w.warmup)

    @property
    def decided(self) -> bool:
        """False where a check could not tell (a leak neither shown nor excluded by a soak this short)."""
        return all(decided(c) for c in self.checks)

    @property
    def outcome(self) -> str:
        passed = all(c.passed for c in self.checks)
        return "NOT clean" if not passed else "clean" if self.decided else "not decided"

    def criterion(self) -> Criterion:
        """One gate criterion: passed when every check did (one not decided fails nothing); its detail and numbers
        list each of them."""
        passed = all(c.passed for c in self.checks)
        word = lambda c: "FAIL" if not c.passed else "pass" if decided(c) else "not decided"   # noqa: E731
        detail = (f"soak c={self.concurrency} {self.measured_s:.0f} s: "
                  + "; ".join(f"{c.detail} ({word(c)})" for c in self.checks))
        numbers = {f"{c.name}/{k}": v for c in self.checks for k, v in c.numbers.items()}
        numbers.update({f"{c.name}/passed": float(c.passed) for c in self.checks})
        return Criterion("soak", passed, detail, numbers)

    # --- output ---------------------------------------------------------------------------------------------
    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(asdict(self.windows[0])))
        w.writeheader()
        for row in self.windows:
            w.writerow({k: "" if v is None else round(v, 4) if isinstance(v, float) else v
                        for k, v in asdict(row).items()})
        return buf.getvalue()

    def to_metrics(self) -> dict[str, float]:
        measured = [w for w in self.windows if not w.warmup]
        out = {f"soak/{k}": v for k, v in self.criterion().numbers.items()}
        out.update({"soak/concurrency": float(self.concurrency), "soak/measured_s": self.measured_s,
                    "soak/rss_mb_peak": max(w.rss_mb_peak for w in measured)})
        return out

    def to_markdown(self) -> str:
        lines = [f"# Soak at concurrency {self.concurrency}: {self.outcome}", "",
                 f"{self.measured_s:.0f} s measured after {sum(w.warmup for w in self.windows)} warm-up "
                 f"window(s).{' ' + self.gpu_note + '.' if self.gpu_note else ''}", "",
                 "| check | result | detail |", "|---|---|---|"]
        lines += [f"| {c.name} | {'pass' if c.passed else 'FAIL'} | {c.detail} |" for c in self.checks]
        lines += ["", "| start s | warm-up | requests | errors | P95 E2E ms | QPS | RSS MB | GPU MB |",
                  "|---|---|---|---|---|---|---|---|"]
        fmt = lambda v, f: "–" if v is None else f % v  # noqa: E731
        lines += [f"| {w.start_s:.1f} | {'yes' if w.warmup else ''} | {w.requests} | {w.errors} | "
                  f"{fmt(w.p95_e2e_ms, '%.1f')} | {w.qps:.2f} | {w.rss_mb:.1f} | {fmt(w.gpu_mem_mb, '%.0f')} |"
                  for w in self.windows]
        return "\n".join(lines) + "\n"

    def figure(self):
        panels = [("p95_e2e_ms", "P95 E2E ms"), ("qps", "requests/s"), ("rss_mb", "RSS MB")]
        if all(w.gpu_mem_mb is not None for w in self.windows):
            panels.append(("gpu_mem_mb", "GPU memory MB"))
        fig = Figure(figsize=(8, 2.2 * len(panels)), layout="constrained")
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        t = np.array([w.mid_s for w in self.windows])
        warm_end = max((w.start_s + w.duration_s for w in self.windows if w.warmup), default=None)
        fits = {c.name: c for c in self.checks}
        for ax, (col, label) in zip(axes, panels):
            y = np.array([np.nan if getattr(w, col) is None else getattr(w, col) for w in self.windows], float)
            ax.plot(t, y, marker=".", lw=1)
            ax.set_ylabel(label)
            if warm_end is not None:
                ax.axvspan(0, warm_end, color="0.9", label="warm-up (not fitted)")
            fit = fits.get({"rss_mb": "leak_rss", "gpu_mem_mb": "leak_gpu"}.get(col, ""))
            if fit is not None and "slope_mb_per_h" in fit.numbers:
                tm = np.array([w.mid_s for w in self.windows if not w.warmup])
                ym = np.array([getattr(w, col) for w in self.windows if not w.warmup], float)
                slope = fit.numbers["slope_mb_per_h"] / 3600
                ax.plot(tm, np.median(ym - slope * tm) + slope * tm, "--",
                        color="tab:red" if not fit.passed else "tab:green",
                        label=f"Theil-Sen {fit.numbers['slope_mb_per_h']:+.1f} MB/h")
                ax.legend(loc="best", fontsize=8)
        axes[-1].set_xlabel("seconds since the soak began")
        fig.suptitle(f"Soak at concurrency {self.concurrency}: "
                     + ", ".join(f"{c.name} {'pass' if c.passed else 'FAIL'}" for c in self.checks))
        return fig
