"""The tiny common interface every rung implements.

An Optimizer edits a candidate's recipe (experiments/core/recipe.py) and says, through `check`, when it does not
apply: its own ordering rules and the machine, then the engine's answer about the candidate it would produce
(experiments.serving.refusal: each engine owns its limits).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from experiments.core.recipe import Candidate, Env

SERVING_ENGINES = ("vllm", "llama.cpp", "sglang", "tensorrt-llm")
# What a serving engine's own server does that an in-process engine starts without: an engine swap away from a
# server (a champion that is llama-server with its defaults, say) starts from these, at the champion's precision.
IN_PROCESS_START = {"batching": "none", "max_batch": 1, "max_wait_ms": 0.0, "max_tokens_per_step": 0,
                    "prefix_caching": False, "kv_cache_dtype": "auto", "speculative": "none", "tensor_parallel": 1,
                    "pipeline_parallel": 1}


def leaving_server(cand: Candidate) -> dict:
    """The recipe changes an in-process engine swap makes to `cand`: IN_PROCESS_START where a server runs it."""
    return IN_PROCESS_START if cand.recipe.engine in SERVING_ENGINES else {}


class Optimizer(ABC):
    name: str = "optimizer"
    cost: str = "zero"       # zero | mid | high, as the seed classes them
    decision: str = ""       # why `check` let it run, when it decided from evidence (or was forced)
    # Drift from the baseline's next-token distribution is a gate criterion for rungs that should not change
    # what the model says (engines, precision, quantization); a retrained model is judged on accuracy alone.
    fidelity_gated: bool = True
    force: bool = False      # run whatever the evidence says; like a required rung, it must still be judgeable
    # `check` weighs evidence about the model (distillation: is it the bottleneck?): the diagnosis weighs that
    # evidence itself rather than asking the rung
    weighs_evidence: bool = False
    # What the gate asks of it (experiments/judge/gate.py AIMS): speed, a gain; or memory, a saving at no slowdown
    # (experiments/judge/memory_saving.py). Set by `aim:` in the rung's conf/rung file, beside `_target_`.
    aim: str = "speed"
    # While `apply` runs, the rung's stage.progress(done, total, what, unit): a long apply (training) counts.
    on_progress = None

    def observe(self, champion) -> None:
        """The current champion's RungOutcome (None before the baseline), just before `check`: rungs that
        decide from evidence (distillation: is the model layer the bottleneck?) keep what they need."""

    def machine_check(self, env: Env) -> str | None:
        """The reason this machine cannot run the rung whatever the champion (no CUDA device, a missing
        package), or None. A rung in `ladder.required` failing it stops the sweep before any work."""
        return None

    def config_check(self) -> tuple[str, str] | None:
        """(what is wrong, what to do) where the sweep's config leaves this rung nothing to be judged on,
        whatever the machine and the champion (distillation without an accuracy task), or None. A required or
        forced rung failing it stops the sweep before any work."""
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

    def aim_for(self, cand: Candidate) -> str:
        """What the gate asks of `cand`, this rung's candidate: `aim`, unless its engine makes it mean nothing."""
        return self.aim

    def applied(self) -> dict[str, str]:
        """What the last `apply` did that the candidate's recipe does not say (what a student learned from, for
        how many tokens), for the rung run's params."""
        return {}
