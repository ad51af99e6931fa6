"""Closed-loop load over a concurrency ladder, with per-token timestamps.

Definitions (ARCHITECTURE.md, as vLLM / genai-perf use them): TTFT = first token - send; E2E = last token - send;
TPOT = (E2E - TTFT) / (output tokens - 1); ITL = the gaps between tokens; queue time = start of the first
engine step - arrival; model time = the engine's own compute. Errors and timeouts are counted as rates and
kept out of the latency percentiles.
"""
from __future__ import annotations

import csv
import io
import queue
import random
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import psutil

from experiments.serving.engine import Engine
from experiments.stats import MIN_SAMPLES_FOR_P99, LatencyStats

LATENCY_METRICS = ("e2e_ms", "ttft_ms", "tpot_ms", "itl_ms", "queue_ms", "model_ms")
# An encoder's request has one output (its embedding): TTFT, TPOT and ITL do not apply; batch_ms is the wall
# time of each batch (one sample per batch, not per request).
ENCODER_METRICS = ("e2e_ms", "queue_ms", "model_ms", "batch_ms")


# --- workload ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    id: int
    token_ids: tuple[int, ...]
    max_new_tokens: int


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]      # measured, in a fixed seeded order
    warmup: tuple[Prompt, ...]       # distinct from the measured ones
    metrics: tuple[str, ...] = LATENCY_METRICS   # the latency metrics that apply to this kind of request

    @classmethod
    def from_sentences(cls, texts: list[str], tokenizer, count: int, warmup_count: int, seed: int,
                       max_tokens: int) -> "Workload":
        """Texts to embed (queries and passages: a mix of lengths), tokenized with their special tokens and
        truncated to max_tokens, in a seeded order; one output each (the embedding)."""
        if count < 1 or len(texts) < 2:
            raise ValueError("an embedding workload needs at least one prompt and two texts")
        rng = random.Random(seed)
        picked = [texts[rng.randrange(len(texts))] for _ in range(count + warmup_count)]
        prompts = [Prompt(i, tuple(tokenizer(text, truncation=True, max_length=max_tokens)["input_ids"]), 1)
                   for i, text in enumerate(picked)]
        return cls(prompts=tuple(prompts[:count]), warmup=tuple(prompts[count:]), metrics=ENCODER_METRICS)

    @classmethod
    def from_texts(cls, texts: list[str], tokenizer, input_tokens, output_tokens, count: int,
                   warmup_count: int, seed: int, shared_prefix_tokens: int = 0) -> "Workload":
        """Windows of held-out text cut to a mix of input lengths, each with a mix of output lengths.

        shared_prefix_tokens > 0 puts the same leading tokens (a "system prompt") before every prompt, input
        lengths counting after it: the load that shows what prefix caching saves."""
        rng = random.Random(seed)
        stream = [t for text in texts for t in tokenizer.encode(text, add_special_tokens=False)]
        longest = max(input_tokens) + shared_prefix_tokens
        if not input_tokens or not output_tokens or count < 1:
            raise ValueError("a workload needs input and output lengths and at least one prompt")
        if len(stream) <= longest + 1:
            raise ValueError(f"workload text has {len(stream)} tokens; need more than {longest + 1}")
        start = rng.randrange(0, len(stream) - shared_prefix_tokens) if shared_prefix_tokens else 0
        prefix = tuple(stream[start:start + shared_prefix_tokens])
        prompts = []
        for i in range(count + warmup_count):
            n_in = rng.choice(list(input_tokens))
            start = rng.randrange(0, len(stream) - n_in)
            prompts.append(Prompt(i, prefix + tuple(stream[start:start + n_in]), rng.choice(list(output_tokens))))
        return cls(prompts=tuple(prompts[:count]), warmup=tuple(prompts[count:]))


# --- one request's life -----------------------------------------------------------------------------------
class TokenList(list):
    """A request's token ids. Servers append to it directly; `listener`, when set, is called (in the server's
    thread) after each append, so an HTTP handler can stream every token as it is produced."""
    listener = None

    def append(self, token) -> None:
        super().append(token)
        if self.listener is not None:
            self.listener()


@dataclass
class RequestRecord:
    prompt: Prompt
    arrival: float = 0.0               # intended send time: latencies count from here (no coordinated omission)
    sent: float = 0.0                  # when the load generator actually handed it over
    engine_start: float | None = None
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=TokenList)
    model_s: float = 0.0
    error: str | None = None
    timed_out: bool = False
    cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def __getstate__(self) -> dict:
        """A finished record travels from a rung's child process to the sweep; its Event stays behind."""
        state = dict(self.__dict__)
        state["done"] = None
        return state

    @classmethod
    def arriving(cls, prompt: "Prompt", intended: float | None = None) -> "RequestRecord":
        """A request handed over now; its latency counts from `intended` (open loop) or from now."""
        now = time.perf_counter()
        return cls(prompt, arrival=now if intended is None else intended, sent=now)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and len(self.token_times) > 0

    def metrics(self) -> dict[str, float]:
        t = self.token_times
        m = {"e2e_ms": (t[-1] - self.arrival) * 1e3, "ttft_ms": (t[0] - self.arrival) * 1e3,
             "output_tokens": len(t), "input_tokens": len(self.prompt.token_ids),
             "send_lag_ms": (self.sent - self.arrival) * 1e3}
        if self.engine_start is not None:   # unknown behind an external endpoint: absent, not faked
            m.update(queue_ms=(self.engine_start - self.arrival) * 1e3, model_ms=self.model_s * 1e3)
        if len(t) > 1:
            m["tpot_ms"] = (t[-1] - t[0]) * 1e3 / (len(t) - 1)
        return m


class SequentialServer:
    """A FIFO request queue in front of one engine that serves one request at a time (no batching)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._queue: queue.Queue[RequestRecord | None] = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name="roi-server", daemon=True)
        self._worker.start()

    def submit(self, prompt: Prompt, intended: float | None = None) -> RequestRecord:
        rec = RequestRecord.arriving(prompt, intended)
        self._queue.put(rec)
        return rec

    def _serve(self) -> None:
        while (rec := self._queue.get()) is not None:
            if rec.cancelled:
                rec.done.set()
                continue
            rec.engine_start = time.perf_counter()
            try:
                for token, compute in self.engine.generate(list(rec.prompt.token_ids), rec.prompt.max_new_tokens):
                    rec.token_times.append(time.perf_counter())
                    rec.tokens.append(token)
                    rec.model_s += compute
                    if rec.cancelled:
                        break
            except Exception as exc:  # an engine failure is a request error, counted and reported
                rec.error = f"{type(exc).__name__}: {exc}"
            rec.done.set()

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=30)


# --- resource sampling ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResourceSeries:
    """The samples of one level, in time order, every `interval_s`: what the diagnosis reads curve shapes from.
    CPU percent is of one core (psutil: 200 = two cores busy); GPU lists are empty without NVML."""
    interval_s: float
    cpu_percent: tuple[float, ...] = ()
    rss_mb: tuple[float, ...] = ()
    host_mem_percent: tuple[float, ...] = ()
    gpu_util: tuple[float, ...] = ()
    gpu_mem_mb: tuple[float, ...] = ()
    gpu_mem_total_mb: float | None = None
    cpu_count: int = 1
    gpu_skipped: str = ""


class ResourceSampler:
    """CPU utilisation and RSS of this (serving) process, GPU utilisation and memory through NVML when a CUDA
    device is present, and the KV blocks a paged-cache server holds, sampled in the background."""

    def __init__(self, interval_s: float = 0.25, kv_probe=None):
        self.interval_s = interval_s
        self.cpu: list[float] = []
        self.rss_mb: list[float] = []
        self.gpu_util: list[float] = []
        self.gpu_mem_mb: list[float] = []
        self.kv_mb: list[float] = []
        self.host_mem_percent: list[float] = []
        self.gpu_mem_total_mb: float | None = None
        self.gpu_skipped = ""
        self._kv_probe = kv_probe
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._gpu = self._nvml_handle()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _nvml_handle(self):
        import torch

        if not torch.cuda.is_available():
            self.gpu_skipped = "no CUDA device: GPU sampling not applicable here"
            return None
        try:
            import pynvml
        except ImportError:
            self.gpu_skipped = "nvidia-ml-py is not installed (pip install -e '.[gpu]')"
            return None
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

    def __enter__(self):
        self._proc.cpu_percent(None)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.interval_s):
            self.cpu.append(self._proc.cpu_percent(None))
            self.rss_mb.append(self._proc.memory_info().rss / 2**20)
            self.host_mem_percent.append(psutil.virtual_memory().percent)
            if self._gpu is not None:
                import pynvml

                self.gpu_util.append(float(pynvml.nvmlDeviceGetUtilizationRates(self._gpu).gpu))
                memory = pynvml.nvmlDeviceGetMemoryInfo(self._gpu)
                self.gpu_mem_mb.append(memory.used / 2**20)
                self.gpu_mem_total_mb = memory.total / 2**20
            usage = self._kv_probe() if self._kv_probe else None
            if usage is not None:
                self.kv_mb.append(usage.mb_in_use)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def series(self) -> ResourceSeries:
        return ResourceSeries(self.interval_s, tuple(self.cpu), tuple(self.rss_mb), tuple(self.host_mem_percent),
                              tuple(self.gpu_util), tuple(self.gpu_mem_mb), self.gpu_mem_total_mb,
                              psutil.cpu_count() or 1, self.gpu_skipped)

    def summary(self) -> dict[str, float | None]:
        mean = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
        peak = lambda xs: float(max(xs)) if xs else None  # noqa: E731
        return {"cpu_percent_mean": mean(self.cpu) or 0.0,
                "rss_mb_max": peak(self.rss_mb) or psutil.Process().memory_info().rss / 2**20,
                "gpu_util_mean": mean(self.gpu_util), "gpu_mem_mb_max": peak(self.gpu_mem_mb),
                "kv_mb_max": peak(self.kv_mb)}


# --- one concurrency level --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LevelReport:
    concurrency: int                   # closed loop: clients; open loop: the rate in requests/s, rounded
    duration_s: float
    records: tuple[RequestRecord, ...] = field(repr=False)
    stats: dict[str, LatencyStats | None] = field(repr=False)
    cpu_percent_mean: float
    rss_mb_max: float
    min_requests_met: bool
    offered_qps: float | None = None   # open loop only: the arrival rate asked for
    started: float = 0.0
    gpu_util_mean: float | None = None  # NVML, when a CUDA device is present
    gpu_mem_mb_max: float | None = None
    kv_mb_max: float | None = None     # paged KV cache: the most KV memory the sequences held at once
    resources: ResourceSeries | None = field(default=None, repr=False)   # the samples, for the diagnosis

    def validity(self, windows: int = 5, tolerance: float = 0.10) -> dict[str, bool]:
        """ARCHITECTURE.md's rules: stable = last 3 windows within +-10 % (throughput and P50 E2E);
        saturated = achieved/offered < 0.98; no P99 claim under 100 samples; invalid above 1 % errors."""
        flags = {"stable": self._stable(windows, tolerance), "p99_claimable": self.n_ok >= MIN_SAMPLES_FOR_P99,
                 "error_rate_ok": self.error_rate <= 0.01, "min_requests_met": self.min_requests_met}
        if self.offered_qps:
            flags["saturated"] = self.qps / self.offered_qps < 0.98
        return flags

    def _stable(self, windows: int, tolerance: float) -> bool:
        ok = [r for r in self.records if r.ok]
        if len(ok) < 3 * windows:
            return False
        edges = np.linspace(self.started, self.started + self.duration_s, windows + 1)
        done = np.array([r.token_times[-1] for r in ok])
        e2e = np.array([r.metrics()["e2e_ms"] for r in ok])
        per_window = [(int(((done >= a) & (done < b)).sum()), e2e[(done >= a) & (done < b)])
                      for a, b in zip(edges[:-1], edges[1:])][-3:]
        counts = np.array([c for c, _ in per_window], float)
        if (counts == 0).any():
            return False
        p50s = np.array([np.median(v) for _, v in per_window])
        return all(np.abs(x / x.mean() - 1).max() <= tolerance for x in (counts, p50s))

    def goodput(self, slos) -> tuple[float, float]:
        """(requests/s meeting every SLO, share of all requests that did); errors and timeouts are misses."""
        from experiments.slo import request_meets

        good = sum(request_meets(r, slos) for r in self.records)
        return good / self.duration_s, good / max(1, len(self.records))

    @property
    def n_ok(self) -> int:
        return sum(r.ok for r in self.records)

    @property
    def error_rate(self) -> float:
        return sum(r.error is not None for r in self.records) / max(1, len(self.records))

    @property
    def timeout_rate(self) -> float:
        return sum(r.timed_out for r in self.records) / max(1, len(self.records))

    @property
    def qps(self) -> float:
        return self.n_ok / self.duration_s

    @property
    def output_tokens_per_s(self) -> float:
        return sum(len(r.token_times) for r in self.records if r.ok) / self.duration_s

    @property
    def decodes(self) -> bool:
        return "ttft_ms" in self.stats

    @property
    def input_tokens_per_s(self) -> float:
        return sum(len(r.prompt.token_ids) for r in self.records if r.ok) / self.duration_s

    @property
    def batch_size_mean(self) -> float:
        """Requests per engine batch (those that share an engine start)."""
        starts = [r.engine_start for r in self.records if r.ok and r.engine_start is not None]
        return len(starts) / max(1, len(set(starts)))

    def values(self, metric: str) -> np.ndarray:
        ok = [r for r in self.records if r.ok]
        if metric == "batch_ms":
            batches: dict[float, float] = {}
            for r in ok:
                if r.engine_start is not None:
                    batches[r.engine_start] = max(batches.get(r.engine_start, 0.0), r.token_times[-1] - r.engine_start)
            return np.array(list(batches.values())) * 1e3
        if metric == "itl_ms":
            return np.concatenate([np.diff(r.token_times) * 1e3 for r in ok]) if ok else np.array([])
        return np.array([m[metric] for m in (r.metrics() for r in ok) if metric in m])


def run_level(server: SequentialServer, workload: Workload, load: float, cfg, confidence: float) -> LevelReport:
    """One level: warm-up (discarded), then the measured window. `load` is clients (closed) or requests/s (open)."""
    open_loop = cfg.get("mode", "closed") == "open"
    if load <= 0 or (not open_loop and int(load) != load):
        raise ValueError(f"{'rate' if open_loop else 'concurrency'} must be {'> 0' if open_loop else 'an integer >= 1'}"
                         f", got {load}")

    def drive(prompts, min_requests, min_s):
        if open_loop:
            return _open_loop(server, prompts, float(load), cfg.get("arrival", "poisson"), cfg.get("gamma_shape", 1.0),
                              int(cfg.get("seed", 0)), min_requests, min_s, cfg.max_duration_s, cfg.request_timeout_s)
        return _closed_loop(server, prompts, int(load), min_requests, min_s, cfg.max_duration_s,
                            cfg.request_timeout_s)

    drive(workload.warmup, cfg.warmup_requests, cfg.get("warmup_s", 0.0))
    with ResourceSampler(kv_probe=getattr(server, "kv_usage", None)) as sampler:
        started = time.perf_counter()
        records = drive(workload.prompts, cfg.min_requests, cfg.min_duration_s)
        duration = time.perf_counter() - started
    level = LevelReport(concurrency=int(round(load)), duration_s=duration, records=tuple(records), stats={},
                        min_requests_met=len(records) >= cfg.min_requests,
                        offered_qps=float(load) if open_loop else None, started=started,
                        resources=sampler.series(), **sampler.summary())
    level.stats.update({m: LatencyStats.from_samples(level.values(m), confidence) for m in workload.metrics})
    return level


def _open_loop(server, prompts, rate, process, gamma_shape, seed, min_requests, min_s, max_s, timeout_s):
    """Arrivals on a seeded Poisson (or gamma) schedule, whatever the server does; latency counts from the
    intended send time, and the lag of the actual send is recorded, so coordinated omission shows."""
    rng = np.random.default_rng(seed)
    records: list[RequestRecord] = []
    started = intended = time.perf_counter()
    while True:
        elapsed = intended - started
        if elapsed >= max_s or (elapsed >= min_s and len(records) >= min_requests):
            break
        intended += rng.exponential(1 / rate) if process == "poisson" else rng.gamma(gamma_shape, 1 / (rate * gamma_shape))
        time.sleep(max(0.0, intended - time.perf_counter()))
        records.append(server.submit(prompts[len(records) % len(prompts)], intended=intended))
    for rec in records:
        left = rec.arrival + timeout_s - time.perf_counter()
        if not rec.done.wait(max(0.0, left)) or (rec.token_times and rec.token_times[-1] - rec.arrival > timeout_s):
            rec.timed_out = rec.cancelled = True
    return records


def _closed_loop(server, prompts, concurrency, min_requests, min_s, max_s, timeout_s) -> list[RequestRecord]:
    """`concurrency` clients, each sending its next request as soon as the last one finished."""
    records: list[RequestRecord] = []
    lock = threading.Lock()
    started = time.perf_counter()
    counter = iter(range(10**9))

    def enough() -> bool:
        elapsed = time.perf_counter() - started
        return elapsed >= max_s or (elapsed >= min_s and len(records) >= min_requests)

    def client():
        while True:
            with lock:
                if enough():
                    return
                i = next(counter)
            rec = server.submit(prompts[i % len(prompts)])
            if not rec.done.wait(timeout_s):
                rec.timed_out = rec.cancelled = True
            with lock:
                records.append(rec)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def check_load(bench) -> None:
    """The load settings, checked before anything is built or sent."""
    from experiments.errors import ConfigError
    from experiments.slo import parse_all

    slos = parse_all(bench.slos)
    if bench.mode not in ("closed", "open"):
        raise ConfigError(f"benchmark.mode {bench.mode!r} is unknown", "use closed or open")
    levels = list(bench.concurrency)
    if not levels or any(int(c) != c or int(c) < 1 for c in levels):
        raise ConfigError(f"benchmark.concurrency must list integers >= 1, got {levels}",
                          "e.g. benchmark.concurrency=[1,2,4]")
    if bench.mode == "open" and (not list(bench.rates) or any(float(r) <= 0 for r in bench.rates)):
        raise ConfigError(f"benchmark.rates must list rates > 0 requests/s, got {list(bench.rates)}",
                          "e.g. benchmark.rates=[2,4,8]")
    if bench.sla_search and not slos:
        raise ConfigError("benchmark.sla_search=true needs SLOs", "set benchmark.slos=[p99_e2e_ms<=500]")


# --- the whole ladder -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchmarkReport:
    levels: tuple[LevelReport, ...]
    slos: tuple = ()
    capacity: object | None = None     # slo.CapacityResult when the SLA-capacity search ran

    def level(self, concurrency: int) -> LevelReport:
        for lv in self.levels:
            if lv.concurrency == concurrency:
                return lv
        raise KeyError(f"no level at concurrency {concurrency}; measured: {[lv.concurrency for lv in self.levels]}")

    def metric_series(self) -> dict[str, list[tuple[int, float]]]:
        """MLflow metrics: name -> [(step = concurrency, value)]."""
        out: dict[str, list[tuple[int, float]]] = {}

        def put(name, step, value):
            if value is not None and np.isfinite(value):
                out.setdefault(name, []).append((step, float(value)))

        for lv in self.levels:
            c = lv.concurrency
            for metric, st in lv.stats.items():
                if st is None:
                    continue
                for name in ("mean", "p50", "p95", "p99"):
                    put(f"{metric}_{name}", c, st.stat(name))
            put("qps", c, lv.qps)
            if lv.decodes:
                put("output_tokens_per_s", c, lv.output_tokens_per_s)
            else:
                put("embeddings_per_s", c, lv.qps)
                put("input_tokens_per_s", c, lv.input_tokens_per_s)
                put("batch_size_mean", c, lv.batch_size_mean)
            put("error_rate", c, lv.error_rate)
            put("timeout_rate", c, lv.timeout_rate)
            put("requests", c, len(lv.records))
            put("cpu_percent", c, lv.cpu_percent_mean)
            put("offered_qps", c, lv.offered_qps)
            if self.slos:
                goodput, attainment = lv.goodput(self.slos)
                put("goodput_rps", c, goodput)
                put("slo_attainment", c, attainment)
            put("rss_mb_max", c, lv.rss_mb_max)
            put("gpu_util_percent", c, lv.gpu_util_mean)
            put("gpu_mem_mb_max", c, lv.gpu_mem_mb_max)
            put("kv_mb_in_use_max", c, lv.kv_mb_max)
        if self.capacity is not None and self.capacity.concurrency is not None:
            put("sla_capacity_concurrency", 0, self.capacity.concurrency)
        return out

    def samples_csv(self) -> str:
        buf = io.StringIO()
        cols = ["concurrency", "prompt_id", "input_tokens", "output_tokens", "e2e_ms", "ttft_ms", "tpot_ms",
                "queue_ms", "model_ms", "send_lag_ms", "error", "timed_out"]
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        for lv in self.levels:
            for r in lv.records:
                row = {"concurrency": lv.concurrency, "prompt_id": r.prompt.id, "error": r.error or "",
                       "timed_out": r.timed_out, "input_tokens": len(r.prompt.token_ids),
                       "output_tokens": len(r.token_times)}
                if r.ok:
                    row.update({k: round(v, 4) for k, v in r.metrics().items()
                                if k in cols and (lv.decodes or k not in ("ttft_ms", "tpot_ms"))})
                w.writerow(row)
        return buf.getvalue()

    def validity(self) -> dict[str, bool]:
        return {f"c{lv.concurrency}_{flag}": value for lv in self.levels for flag, value in lv.validity().items()}


def serve(engine: Engine):
    """The server for the engine's recipe: one request at a time, or a batching scheduler."""
    recipe = getattr(engine, "recipe", None)
    if recipe is None or recipe.batching == "none":
        return SequentialServer(engine)
    if not engine.decodes:
        if recipe.batching not in ("static", "dynamic"):
            raise ValueError(f"an encoder batches statically or dynamically, not {recipe.batching!r}")
        from experiments.serving.encoder_batching import EncoderBatchServer

        return EncoderBatchServer(engine, recipe.max_batch, recipe.max_wait_ms)
    if recipe.batching == "continuous" and engine.name == "torch":
        from experiments.serving.continuous import ContinuousServer

        if recipe.scheduler == "own":
            from experiments.serving.iteration import IterationServer

            if recipe.prefix_caching:
                raise ValueError("prefix caching needs transformers' paged KV cache; the own scheduler has none")
            return IterationServer(engine, recipe.max_batch, recipe.max_tokens_per_step)
        if recipe.scheduler != "transformers":
            raise ValueError(f"unknown continuous scheduler {recipe.scheduler!r}; known: transformers, own")
        return ContinuousServer(engine, recipe.max_tokens_per_step, recipe.kv_block_size, recipe.kv_num_blocks,
                                recipe.prefix_caching)
    from experiments.serving.batching import BatchingServer

    return BatchingServer(engine, recipe.batching, recipe.max_batch, recipe.max_wait_ms)


def run_benchmark(engine: Engine, workload: Workload, cfg, confidence: float = 0.95,
                  on_level=lambda c: None) -> BenchmarkReport:
    """The load ladder (concurrency, or rates in open-loop mode), then the SLA-capacity search if asked."""
    server = serve(engine)
    try:
        return run_ladder(server, workload, cfg, confidence, on_level)
    finally:
        server.close()


def run_ladder(server, workload: Workload, cfg, confidence: float = 0.95,
               on_level=lambda c: None) -> BenchmarkReport:
    """run_benchmark over a server that is already up (in-process, or an HTTP endpoint); the caller closes it."""
    from experiments.errors import ConfigError
    from experiments.slo import applicable, parse_all, sla_capacity

    slos, _ = applicable(parse_all(cfg.get("slos")), workload.metrics)
    if not workload.prompts:
        raise ConfigError("the workload has no prompts", "set target.workload.prompts to 1 or more")
    open_loop = cfg.get("mode", "closed") == "open"
    measured: dict[int, LevelReport] = {}

    def measure(load):
        on_level(load)
        level = run_level(server, workload, load, cfg, confidence)
        measured[level.concurrency] = level
        return level

    for load in (cfg.rates if open_loop else cfg.concurrency):
        measure(float(load) if open_loop else int(load))
    capacity = None
    if cfg.get("sla_search") and not open_loop:
        capacity = sla_capacity(lambda c: measured.get(c) or measure(c), list(cfg.concurrency), slos)
    return BenchmarkReport(tuple(measured[k] for k in sorted(measured)), tuple(slos), capacity)
