"""The tiny common interface every rung implements, and the recipe it edits.

A Candidate is a recipe (engine, precision, quantization, ...) that an engine builds; an Optimizer edits the
recipe and says, through `check`, when it does not apply: its own ordering rules and the machine, then the
engine's answer about the candidate it would produce (experiments.serving.refusal: each engine owns its limits).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Target:
    name: str
    kind: str            # a target kind's name (experiments/kinds): causal-lm | embedding
    model_dir: Path      # a Hugging Face folder (config, safetensors, tokenizer)

    @property
    def decodes(self) -> bool:
        """Whether its model decodes token by token (decode steps, a KV cache) or, like an encoder, runs one
        forward pass per request: rungs ask this, not the kind's name."""
        from experiments.kinds import kind_of

        return kind_of(self.kind).decodes


@dataclass(frozen=True)
class Recipe:
    engine: str = "torch"            # torch | onnxruntime | openvino (encoders)
    precision: str = "fp32"          # fp32 | bf16 | fp16
    quantization: str = "none"       # none | int8 | int4 | fp8 (weights of the decoder layers)
    execution_provider: str = "cpu"  # cpu | cuda (the device, for either engine; set from target.device)
    cuda_device: int = 0             # which CUDA device (torch's index) when execution_provider is cuda
    compile: str = "none"            # torch: none | inductor
    cuda_graph: bool = False         # capture the decode step as a CUDA graph (torch: reduce-overhead)
    batching: str = "none"           # none (one request at a time) | static | dynamic | continuous
    max_batch: int = 1
    max_wait_ms: float = 0.0         # static: wait for a full batch this long at most; dynamic: the window
    kv_block_size: int = 0           # continuous (paged KV cache): tokens per block
    kv_num_blocks: int = 0           # continuous: blocks in the pool
    max_tokens_per_step: int = 0     # continuous: prefill + decode tokens one step may carry
    prefix_caching: bool = False     # continuous: full KV blocks of a shared prompt prefix are reused
    # continuous batching over the torch model: transformers (its paged-KV manager) | own (iteration-level
    # scheduler over a left-padded batched KV cache, experiments/serving/iteration.py). Runs logged before
    # this field ran transformers', hence the default.
    scheduler: str = "transformers"


@dataclass(frozen=True)
class Candidate:
    target: Target
    recipe: Recipe = field(default_factory=Recipe)
    rungs: tuple[str, ...] = ()

    def edited(self, rung: str, **changes) -> "Candidate":
        return Candidate(self.target, replace(self.recipe, **changes), self.rungs + (rung,))

    def describe(self) -> dict:
        return {"rungs": list(self.rungs), **asdict(self.recipe)}


@dataclass(frozen=True)
class Env:
    """What the machine offers; rungs consult it in `check`."""
    cuda: bool
    cuda_capability: tuple[int, int] | None
    cpu_count: int
    cuda_device_count: int | None = None   # None: as many as `cuda` implies (one, or none)

    def __post_init__(self):
        if self.cuda_device_count is None:
            object.__setattr__(self, "cuda_device_count", 1 if self.cuda else 0)

    @classmethod
    def detect(cls) -> "Env":
        import os

        import torch

        cuda = torch.cuda.is_available()
        return cls(cuda=cuda, cuda_capability=torch.cuda.get_device_capability() if cuda else None,
                   cpu_count=os.cpu_count() or 1, cuda_device_count=torch.cuda.device_count() if cuda else 0)


class Optimizer(ABC):
    name: str = "optimizer"
    cost: str = "zero"       # zero | mid | high, as the seed classes them
    decision: str = ""       # why `check` let it run, when it decided from evidence (or was forced)
    # Drift from the baseline's next-token distribution is a gate criterion for rungs that should not change
    # what the model says (engines, precision, quantization); a retrained model is judged on accuracy alone.
    fidelity_gated: bool = True
    # While `apply` runs, the rung's stage.progress(done, total, what, unit): a long apply (training) counts.
    on_progress = None

    def observe(self, champion) -> None:
        """The current champion's RungOutcome (None before the baseline), just before `check`: rungs that
        decide from evidence (distillation: is the model layer the bottleneck?) keep what they need."""

    def machine_check(self, env: Env) -> str | None:
        """The reason this machine cannot run the rung whatever the champion (no CUDA device, a missing
        package), or None. A rung in `ladder.required` failing it stops the sweep before any work."""
        return None

    def check(self, env: Env, cand: Candidate) -> str | None:
        """The reason this rung does not apply to `cand` here, or None when it does."""
        return self.machine_check(env)

    def resident(self, cand: Candidate) -> Candidate | None:
        """The candidate whose weights this rung holds in memory, where it is known before `apply` runs (the
        sweep refuses it before any work if they would not fit); None: judged on what `apply` makes, in the
        rung's own process (apply may crash, hang or take long: it never runs in the sweep's)."""
        return None

    @abstractmethod
    def apply(self, cand: Candidate) -> Candidate:
        """A new candidate with this rung's change to the recipe."""
