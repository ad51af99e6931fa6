"""A serving engine's own Prometheus metrics (GET /metrics), read while a level runs: the requests running and
waiting in its scheduler, its KV-cache use and its preemptions, logged beside what the client measured."""
from __future__ import annotations

import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# A proxy from the environment must not stand in for the server on 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class MetricNames:
    """An engine's names for what is read; a sample's labels (model, engine index) are summed over."""
    running: str
    waiting: str
    kv_cache_usage: str | None = None   # a share of the KV cache in use, 0..1
    preemptions: str | None = None      # a counter: requests evicted from the running batch for KV space


VLLM = MetricNames("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "vllm:num_preemptions_total")
# llama-server (--metrics): slots busy, requests deferred for want of a free slot; no KV-cache share or preemptions.
LLAMA_CPP = MetricNames("llamacpp:requests_processing", "llamacpp:requests_deferred")
GAUGES = ("running", "waiting", "kv_cache_usage")


def scrape(url: str, names: MetricNames, timeout_s: float = 2.0) -> dict[str, float]:
    """{running, waiting, kv_cache_usage, preemptions} from the server's /metrics; the ones it lacks are absent."""
    with _OPENER.open(f"{url}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode(errors="replace")
    wanted = {getattr(names, key): key for key in (*GAUGES, "preemptions") if getattr(names, key)}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (key := wanted.get(sample.name)) is not None:
                found[key] = found.get(key, 0.0) + float(sample.value)
    return found


def summarize(samples: list[dict[str, float]]) -> dict[str, float]:
    """Per level: each gauge's mean and peak, and the preemptions that happened while it ran."""
    out: dict[str, float] = {}
    for key in GAUGES:
        values = [s[key] for s in samples if key in s]
        if values:
            out[f"{key}_mean"], out[f"{key}_max"] = sum(values) / len(values), max(values)
    # requests in the server at one moment (running + waiting in the same scrape), not the two peaks added
    in_flight = [s["running"] + s.get("waiting", 0.0) for s in samples if "running" in s]
    if in_flight:
        out["in_flight_max"] = max(in_flight)
    counts = [s["preemptions"] for s in samples if "preemptions" in s]
    if counts:
        out["preemptions"] = counts[-1] - counts[0]
    return out
