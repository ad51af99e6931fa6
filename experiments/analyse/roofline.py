"""Roofline diagnosis of a causal LM: is each phase (prefill, decode) bound by arithmetic or by memory traffic?

A phase's arithmetic intensity (FLOPs per byte moved) against the hardware's ridge (peak FLOP/s / peak
bandwidth), as in the field guide: below the ridge the phase waits on memory, above it on arithmetic. The
numbers are lower bounds on time from first principles, not measurements; a measured time far above them
points at the runtime layer (overhead, poor kernels), not at the model.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

# Bytes per stored value of a precision or a weight quantization scheme (int4 packs two weights per byte);
# memory_fit sizes with it too.
DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "fp8": 1.0, "int4": 0.5}


def weight_and_kv_bytes(precision: str, quantization: str) -> tuple[float, float]:
    """Bytes per weight and per KV-cache value for a recipe: weight quantization shrinks the weights only."""
    weights = DTYPE_BYTES[quantization] if quantization != "none" else DTYPE_BYTES[precision]
    return weights, DTYPE_BYTES[precision]


# --- the model --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-style decoder (gated MLP, grouped-query attention) that set its FLOPs and bytes."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool

    @classmethod
    def from_config(cls, hf_config) -> "ModelShape":
        cfg = hf_config.get_text_config()   # the decoder's config, also for multimodal wrappers
        hidden, heads = cfg.hidden_size, cfg.num_attention_heads
        return cls(layers=cfg.num_hidden_layers, hidden=hidden,
                   intermediate=getattr(cfg, "intermediate_size", None) or 4 * hidden,
                   heads=heads,
                   kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
                   head_dim=getattr(cfg, "head_dim", None) or hidden // heads,
                   vocab=cfg.vocab_size,
                   tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)))

    @property
    def attention_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def matmul_params(self) -> int:
        """Weights of every linear layer: q, k, v, o, gate, up, down per layer, and the lm_head."""
        attention = self.hidden * (self.attention_width + 2 * self.kv_width) + self.attention_width * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attention + mlp) + self.hidden * self.vocab

    @property
    def params(self) -> int:
        """All weights but the norms' (negligible): a tied embedding is the lm_head, counted once."""
        return self.matmul_params + (0 if self.tied_embeddings else self.hidden * self.vocab)

    @property
    def kv_values_per_token(self) -> int:
        return 2 * self.layers * self.kv_width


@dataclass(frozen=True)
class PhaseCost:
    """FLOPs and bytes of one forward step that processes `tokens` tokens (over the whole batch)."""
    phase: str
    tokens: int
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def phase_cost(shape: ModelShape, phase: str, tokens: int, context: int, batch: int,
               bytes_per_weight: float, bytes_per_kv: float) -> PhaseCost:
    """One forward step: `batch` sequences, each adding `tokens` new tokens after `context` cached ones.
    Prefill of N tokens is tokens=N, context=0, batch=1; decode is tokens=1, context=C, batch=B.

    FLOPs = 2 × matmul_params × batch × tokens          a multiply-add per linear weight per token
          + 4 × attention_width × layers × batch × K    QKᵀ and AV: a multiply-add each per key and channel,
            K = tokens × context + tokens × (tokens + 1) / 2   keys seen, causally (token j sees context + j + 1)
    bytes = matmul_params × bytes_per_weight            every linear weight (lm_head too) read once per step
          + min(batch × tokens, vocab) × hidden × bytes_per_weight    only the embedding rows looked up
          + kv_values_per_token × bytes_per_kv × batch × (context + tokens)   cached K/V read, new K/V written

    Left out, as in the field guide's estimate: norms, softmax, rotary and the activations. For decode they are
    small; a long prefill's activations can add traffic of the order of the weights, so its intensity here is
    an upper estimate (it stays far above a GPU's ridge for prompts of thousands of tokens).
    """
    new_tokens = batch * tokens
    keys_seen = tokens * context + tokens * (tokens + 1) / 2
    flops = (2 * shape.matmul_params * new_tokens
             + 4 * shape.attention_width * shape.layers * batch * keys_seen)
    weight_bytes = (shape.matmul_params + min(new_tokens, shape.vocab) * shape.hidden) * bytes_per_weight
    kv_bytes = shape.kv_values_per_token * bytes_per_kv * batch * (context + tokens)
    return PhaseCost(phase, new_tokens, float(flops), float(weight_bytes + kv_bytes))


# --- the hardware -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float        # FLOP/s
    peak_bandwidth: float    # bytes/s
    cache_bytes: float | None = None   # last on-chip cache: weights that fit stay there between steps
    measured: bool = False

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/byte) at which a kernel stops waiting on memory."""
        return self.peak_flops / self.peak_bandwidth

    @classmethod
    def from_conf(cls, node) -> "Hardware":
        """From a conf/hardware node: spec-sheet peaks, or `measure: true` to benchmark this machine."""
        cache = float(node.cache_bytes) if node.get("cache_bytes") else None
        if node.measure:
            hw = measure_local_cpu(float(node.seconds), int(node.matmul_size), int(node.copy_bytes), node.name)
            return replace(hw, cache_bytes=cache) if cache else hw
        return cls(str(node.name), float(node.peak_flops), float(node.peak_bandwidth), cache)


def measure_local_cpu(seconds: float, matmul_size: int, copy_bytes: int, name: str = "local CPU") -> Hardware:
    """This CPU's peaks as torch sees them (with its current intra-op threads): float32 matmul FLOP/s, and
    copy bandwidth with read + write bytes counted, each the best run within half of `seconds`. The best, not
    the mean, because the roofline asks what the machine can do; other load only ever slows a run down."""
    n = matmul_size
    a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    flops = _best_rate(lambda: torch.mm(a, b, out=out), 2.0 * n ** 3, seconds / 2)
    src = torch.ones(copy_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    bandwidth = _best_rate(lambda: dst.copy_(src), 2.0 * src.numel() * 4, seconds / 2)
    return Hardware(name, flops, bandwidth, _last_level_cache_bytes(), measured=True)


def _last_level_cache_bytes() -> float | None:
    """The largest CPU cache Linux reports (e.g. "32768K" for L3), or None where /sys does not say."""
    units, sizes = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}, []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip()
        sizes.append(float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text))
    return max(sizes) if sizes else None


def _best_rate(run, work: float, seconds: float, min_runs: int = 3) -> float:
    run()   # warm-up: first-touch page faults and kernel selection are not the machine's peak
    best, runs, deadline = math.inf, 0, time.perf_counter() + seconds
    while runs < min_runs or time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        runs += 1
    return work / best


# --- the analysis -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PhasePoint:
    """A phase placed on the hardware's roofline."""
    cost: PhaseCost
    hardware: Hardware
    batch: int
    context: int

    @property
    def bound(self) -> str:
        return "memory" if self.cost.intensity < self.hardware.ridge else "compute"

    @property
    def fits_in_cache(self) -> bool:
        return self.hardware.cache_bytes is not None and self.cost.bytes <= self.hardware.cache_bytes

    @property
    def attainable_flops(self) -> float:
        return min(self.hardware.peak_flops, self.cost.intensity * self.hardware.peak_bandwidth)

    @property
    def min_step_seconds(self) -> float:
        return self.cost.flops / self.attainable_flops

    @property
    def min_seconds_per_token(self) -> float:
        return self.min_step_seconds / self.cost.tokens

    def metrics(self) -> dict[str, float]:
        c = self.cost
        return {"flops_per_token": c.flops / c.tokens, "bytes_per_token": c.bytes / c.tokens,
                "intensity": c.intensity, "attainable_flops": self.attainable_flops,
                "min_step_s": self.min_step_seconds, "min_s_per_token": self.min_seconds_per_token,
                "max_tokens_per_s": 1.0 / self.min_seconds_per_token,
                "memory_bound": float(self.bound == "memory"), "fits_in_cache": float(self.fits_in_cache),
                "batch": float(self.batch), "context": float(self.context), "step_tokens": float(c.tokens)}


@dataclass(frozen=True)
class Roofline:
    shape: ModelShape
    hardware: Hardware
    bytes_per_weight: float
    bytes_per_kv: float
    prefill: PhasePoint
    decode: PhasePoint

    @classmethod
    def analyse(cls, shape: ModelShape, hardware: Hardware, bytes_per_weight: float, bytes_per_kv: float,
                prefill_tokens: int, decode_batch: int, context: int) -> "Roofline":
        """Prefill: one prompt of `prefill_tokens`. Decode: one step of `decode_batch` sequences, each with
        `context` tokens already cached."""
        prefill = phase_cost(shape, "prefill", prefill_tokens, 0, 1, bytes_per_weight, bytes_per_kv)
        decode = phase_cost(shape, "decode", 1, context, decode_batch, bytes_per_weight, bytes_per_kv)
        return cls(shape, hardware, bytes_per_weight, bytes_per_kv,
                   PhasePoint(prefill, hardware, 1, 0), PhasePoint(decode, hardware, decode_batch, context))

    @property
    def phases(self) -> tuple[PhasePoint, PhasePoint]:
        return self.prefill, self.decode

    def to_metrics(self) -> dict[str, float]:
        out = {"roofline/peak_flops": self.hardware.peak_flops,
               "roofline/peak_bandwidth": self.hardware.peak_bandwidth, "roofline/ridge": self.hardware.ridge,
               "roofline/bytes_per_weight": float(self.bytes_per_weight),
               "roofline/bytes_per_kv": float(self.bytes_per_kv),
               "roofline/params": float(self.shape.params)}
        for p in self.phases:
            out.update({f"roofline/{p.cost.phase}/{k}": v for k, v in p.metrics().items()})
        return out

    def summary(self) -> str:
        """One line, for the tag `roi.diagnosis.model_layer`."""
        return "; ".join(f"{p.cost.phase}: {_bound_text(p)} (intensity {_num(p.cost.intensity)} FLOP/byte vs ridge "
                         f"{_num(self.hardware.ridge)})" for p in self.phases) + f" on {self.hardware.name}"

    def recommendation(self) -> str:
        return " ".join([_advice(self.decode, self.hardware), _advice(self.prefill, self.hardware),
                         "These are lower bounds on time: a measured TPOT or TTFT far above them means overhead "
                         "(the runtime layer: engine, kernels, scheduling) dominates, not the model's shape."])

    def to_markdown(self) -> str:
        hw, s = self.hardware, self.shape
        rows = ["| phase | tokens per step | FLOP / token | bytes / token | intensity (FLOP/B) | bound "
                "| attainable FLOP/s | min time / token | max tokens/s |",
                "|---|---|---|---|---|---|---|---|---|"]
        for p in self.phases:
            m = p.metrics()
            rows.append(f"| {p.cost.phase} (batch {p.batch}, context {p.context}) | {p.cost.tokens} "
                        f"| {_si(m['flops_per_token'])} | {_si(m['bytes_per_token'])}B | {_num(m['intensity'])} "
                        f"| {_bound_text(p)} | {_si(m['attainable_flops'])} | {_si(m['min_s_per_token'])}s "
                        f"| {_num(m['max_tokens_per_s'])} |")
        source = "measured here" if hw.measured else "spec sheet"
        return "\n".join([
            "## Roofline (model layer)", "",
            f"**{hw.name}** ({source}): peak {_si(hw.peak_flops)}FLOP/s, {_si(hw.peak_bandwidth)}B/s, "
            f"ridge {_num(hw.ridge)} FLOP/byte"
            + (f", last-level cache {_si(hw.cache_bytes)}B." if hw.cache_bytes else "."),
            f"**Model**: {s.layers} layers × hidden {s.hidden} (MLP {s.intermediate}, {s.heads} heads, "
            f"{s.kv_heads} KV heads × {s.head_dim}), vocab {s.vocab}, {_si(s.params)} parameters; "
            f"{self.bytes_per_weight:g} bytes per weight, {self.bytes_per_kv:g} per KV value.", "",
            *rows, "", self.recommendation(), "",
            "FLOPs: 2 per linear weight per token plus attention scores and values; bytes: every linear weight once "
            "per step, the embedding rows used, the KV cache read and written. Activations are left out.", ""])


def _advice(point: PhasePoint, hw: Hardware) -> str:
    ai = f"intensity {_num(point.cost.intensity)} FLOP/byte"
    if point.cost.phase == "decode" and point.bound == "memory" and point.fits_in_cache:
        return (f"Decode is below the ridge ({ai} < {_num(hw.ridge)}), but its {_si(point.cost.bytes)}B per step fit "
                f"in the {_si(hw.cache_bytes)}B cache, so the weights stay on chip between steps: DRAM bandwidth "
                "is not the limit, and weight quantization buys little bandwidth here; per-step overhead is the "
                "likelier bottleneck.")
    if point.cost.phase == "decode" and point.bound == "memory":
        return (f"Decode is memory-bound ({ai} < ridge {_num(hw.ridge)}): each step reads every weight and the KV "
                f"cache ({_si(point.cost.bytes)}B) for only {point.cost.tokens} new token(s), so weight quantization "
                "(INT8/INT4) and batching raise decode throughput; more FLOP/s does not.")
    if point.cost.phase == "decode":
        return (f"Decode is compute-bound at batch {point.batch} ({ai} ≥ ridge {_num(hw.ridge)}): a larger batch "
                "no longer raises throughput per step; cheaper arithmetic (FP8/INT8 compute) or a smaller model "
                "(distillation, pruning) does.")
    if point.bound == "compute":
        return (f"Prefill is compute-bound ({ai} ≥ ridge {_num(hw.ridge)}): weight-only quantization helps it "
                "little (INT4 speeds decode much more than prefill); fewer FLOPs (prefix/prompt caching, shorter "
                "prompts) or cheaper arithmetic (FP8/INT8 compute) shorten TTFT.")
    return (f"Prefill is memory-bound too ({ai} < ridge {_num(hw.ridge)}): prompts of {point.cost.tokens} tokens "
            "reuse each weight read too little; batching prompts together or weight quantization shortens TTFT.")


def _bound_text(point: PhasePoint) -> str:
    return f"{point.bound}-bound" + (", fits in cache" if point.bound == "memory" and point.fits_in_cache else "")


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _si(x: float) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""),
                           (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}"
    return f"{x:.3g} "


# --- the picture ------------------------------------------------------------------------------------------
def plot(report: Roofline, path: Path | str | None = None):
    """The roofline (log-log: the bandwidth slope, then the compute roof) with prefill and decode marked.
    A bare Figure (no pyplot) renders with Agg and leaves no global state behind in a long sweep."""
    hw = report.hardware
    points = report.phases
    lo = min([hw.ridge] + [p.cost.intensity for p in points]) / 10
    hi = max([hw.ridge] + [p.cost.intensity for p in points]) * 10
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.loglog(xs, [min(hw.peak_flops, x * hw.peak_bandwidth) for x in xs], color="black", lw=2,
              label=f"{hw.name}: {_si(hw.peak_bandwidth)}B/s × intensity, roof {_si(hw.peak_flops)}FLOP/s")
    ax.axvline(hw.ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {_num(hw.ridge)}", (hw.ridge, hw.peak_flops), textcoords="offset points", xytext=(4, -14),
                color="grey")
    for point, color in zip(points, ("tab:blue", "tab:red")):
        ax.plot(point.cost.intensity, point.attainable_flops, "o", ms=9, color=color,
                label=f"{point.cost.phase}, {point.cost.tokens} tokens per step: {_bound_text(point)}")
        ax.annotate(f"{_num(point.cost.intensity)} FLOP/B", (point.cost.intensity, point.attainable_flops),
                    textcoords="offset points", xytext=(8, -14), color=color)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable compute")
    ax.yaxis.set_major_formatter(EngFormatter(unit="FLOP/s"))
    ax.set_ylim(top=hw.peak_flops * 4)
    ax.set_title(f"Roofline: {_si(report.shape.params)} parameters, {report.bytes_per_weight:g} bytes per weight")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
