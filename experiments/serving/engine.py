"""What every engine offers the benchmark and the accuracy harness."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path


class Engine(ABC):
    name: str
    decodes = True    # token by token; an encoder answers a request with one forward pass

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
