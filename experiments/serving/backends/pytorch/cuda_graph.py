"""CUDA Graph: the decode step (one token, batch 1) captured once as a CUDA graph over a static KV cache that the
engine allocates once; each request resets the cache in place, prefills eagerly and replays the graph per token.

A plain `torch.cuda.CUDAGraph`, not torch.compile's `reduce-overhead`: its graph trees are thread-local and each
serving run starts a worker thread, so graphs would be recorded again inside every measured window (and it
compiled the prefill too, with a new cache per request). A captured graph replays from any thread, and no dynamo
recompile limit applies: there is one shape. A step that cannot be captured (a host sync in the model's code)
raises at build, and the rung fails with that error.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from experiments.core.recipe import Candidate
from experiments.serving.backends.pytorch.causal_lm import TorchEngine

WARMUP_STEPS = 3   # eager steps on the side stream before capture: cuBLAS handles and workspaces come into being


def capture(step):
    """(static output, graph): `step` recorded once as a CUDA graph; graph.replay() reruns it into the output."""
    if not torch.cuda.is_available():
        raise ValueError("CUDA graph capture needs a CUDA device")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_STEPS):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return out, graph


class CudaGraphEngine(TorchEngine):
    name = "torch"

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if reason := super().refuses(cand):
            return reason
        if recipe.batching != "none":
            return f"the champion batches ({recipe.batching}); a captured graph has one fixed batch shape"
        if recipe.compile != "none":
            return (f"the champion is compiled ({recipe.compile}); the graph is captured from the eager model, "
                    f"so this rung would undo the compilation rather than add to it")
        return None

    def _capture_decode(self) -> None:
        from transformers import StaticCache  # heavy
        from transformers.cache_utils import StaticLayer  # heavy

        self.max_len = int(self.model.config.max_position_embeddings)
        self.cache = StaticCache(config=self.model.config, max_cache_len=self.max_len)
        if any(type(layer) is not StaticLayer for layer in self.cache.layers):
            # sliding-window layers keep a host-side counter that a replayed graph would not advance
            raise ValueError("decode-step capture here needs full-attention static cache layers; this model has "
                             f"{sorted({type(layer).__name__ for layer in self.cache.layers})}")
        with torch.inference_mode():   # the static tensors are inference tensors: every update runs in this mode
            self.token = torch.zeros((1, 1), dtype=torch.long, device=self.device)
            self.position = torch.zeros(1, dtype=torch.long, device=self.device)
            self._prefill([1])   # allocates the cache's tensors (lazily, at the model's dtype) before capture
            self.logits, self.graph = capture(self._step)
            self.cache.reset()

    def _step(self) -> torch.Tensor:
        return self.model(input_ids=self.token, past_key_values=self.cache, cache_position=self.position,
                          use_cache=True).logits

    def _prefill(self, prompt_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        positions = torch.arange(len(prompt_ids), device=self.device)
        return self.model(input_ids=ids, past_key_values=self.cache, cache_position=positions, use_cache=True).logits

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Iterator[tuple[int, float]]:
        if len(prompt_ids) + max_new_tokens > self.max_len:
            raise ValueError(f"{len(prompt_ids)} + {max_new_tokens} tokens exceed the static cache's {self.max_len}")
        started = time.perf_counter()
        self.cache.reset()   # in place: the graph holds these addresses
        token = int(self._prefill(prompt_ids)[0, -1].argmax())
        yield token, time.perf_counter() - started
        for position in range(len(prompt_ids), len(prompt_ids) + max_new_tokens - 1):
            started = time.perf_counter()
            self.token.fill_(token)
            self.position.fill_(position)
            self.graph.replay()
            token = int(self.logits[0, -1].argmax())   # .item() syncs the device: compute time is real
            yield token, time.perf_counter() - started

    def close(self) -> None:
        self.graph.reset()
        super().close()
