"""What every engine offers the benchmark and the accuracy harness."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from experiments.core.recipe import Candidate, Recipe


class Engine(ABC):
    name: str
    decodes = True    # token by token; an encoder answers a request with one forward pass

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        """Why this engine cannot build the candidate's recipe, or None. The constructor raises it; a rung asks it
        (experiments.serving.refusal) about the candidate it would produce. An engine that says nothing else runs
        the model's weights as given, without torch's compilation."""
        if reason := torch_only(cand.recipe):
            return reason
        if cand.recipe.quantization != "none":
            return f"no weight quantization path for engine {cand.recipe.engine!r}"
        return None

    @classmethod
    def batches_continuously(cls, recipe: Recipe, scheduler: str) -> dict | None:
        """The recipe changes under which this engine batches continuously itself (sequences join and leave at
        every step), or None when it cannot: the batching rung then runs `scheduler` over the torch model."""
        return None

    @classmethod
    def compute_threads(cls, recipe: Recipe, threads: int) -> int:
        """The threads this engine computes with, given the sweep's `threads` (recipe.threads says how many)."""
        return max(1, threads + recipe.threads) if recipe.threads < 0 else recipe.threads or threads

    @classmethod
    def require_buildable(cls, cand: Candidate) -> None:
        if reason := cls.refuses(cand):
            raise ValueError(reason)

    @abstractmethod
    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Iterator[tuple[int, float]]:
        """Greedy decode; yields (token id, seconds of engine compute for that step) as each token is ready.

        Stop tokens are ignored, so every request produces exactly max_new_tokens (as `vllm bench` does with
        ignore_eos): output length is part of the workload, not of the model's whim.
        """

    @abstractmethod
    def lm_eval_model(self, batch_size: int):
        """An lm-eval LM that scores with this engine itself (not with the fp32 model by proxy)."""

    @abstractmethod
    def artefact_paths(self) -> list[Path]:
        """Files that hold what this engine runs (weights, graphs): their size is logged."""

    def weight_bits(self) -> float:
        """Stored bits per weight of the linear layers this engine runs (about 4.5 for INT4 with block scales)."""
        raise NotImplementedError(f"{type(self).__name__} does not report its weight bits")

    def rebuild_seconds(self) -> float:
        """What building this recipe again would take (the gate rebuilds cheap engines for every run)."""
        return float(getattr(self, "build_seconds", 0.0))

    def artefact_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.artefact_paths())

    def close(self) -> None:
        pass


def torch_only(recipe: Recipe) -> str | None:
    """Why an engine other than torch's cannot take the recipe: compilation and graph capture are torch's."""
    if recipe.cuda_graph:
        return (f"the champion runs {recipe.engine}; graph capture here is of the torch model's decode step over a "
                f"static cache")
    if recipe.compile != "none":
        return f"torch.compile compiles the torch engine; the champion runs {recipe.engine}"
    return None


def genai_batching(recipe: Recipe) -> str | None:
    """Static and dynamic batching of a causal LM are onnxruntime-genai's Engine (servers.serve)."""
    if recipe.batching in ("static", "dynamic"):
        return f"static and dynamic batching drive onnxruntime-genai's Engine; the champion runs {recipe.engine}"
    return None


def unpaged_prefix(recipe: Recipe) -> str | None:
    """Prefix caching shares blocks of a paged KV cache, which only continuous batching keeps."""
    if recipe.prefix_caching and recipe.batching != "continuous":
        return (f"prefix caching shares blocks of a paged KV cache, which comes with continuous batching; "
                f"the champion's batching is {recipe.batching}")
    return None
