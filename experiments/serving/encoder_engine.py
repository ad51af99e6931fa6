"""Sentence encoders (target kind `embedding`): one forward pass per batch, mean pooling over the attention
mask, L2 normalisation — what sentence-transformers does for all-MiniLM-L6-v2.

An encoder has no decode steps: `generate` yields once, when the request's embedding is ready, so the load
generator, the one-at-a-time server, the gate's rounds and the soak serve it unchanged (E2E is the time to
the embedding). Batching servers call `embed` with the whole batch.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from experiments.core.recipe import Recipe
from experiments.serving.engine import Engine

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Part of every encoder export's cache key: bump it when MeanPooled or the export settings change.
EXPORT_VERSION = 1


def encoder_refusal(recipe: Recipe) -> str | None:
    """What no encoder engine does: it has no decode steps and keeps no KV cache."""
    if recipe.batching == "continuous":
        return ("continuous batching schedules decode steps; an encoder runs one forward pass per request "
                "(its batching is static or dynamic)")
    if recipe.prefix_caching:
        return "prefix caching reuses KV-cache blocks of a decoder; an encoder keeps no KV cache"
    if recipe.cuda_graph:
        return "graph capture here is of the decode step over a static KV cache; an encoder has neither"
    return None


class EncoderEngine(Engine):
    decodes = False

    @staticmethod
    def padded(batch: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded token ids and attention mask, int64 [B, S]."""
        width = max(len(ids) for ids in batch)
        ids = np.full((len(batch), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for i, row in enumerate(batch):
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
        return ids, mask

    def embed(self, batch: Sequence[Sequence[int]]) -> tuple[np.ndarray, float]:
        """(L2-normalised float32 embeddings [B, D], seconds of engine compute) for token-id rows."""
        ids, mask = self.padded(batch)
        started = time.perf_counter()
        out = self._run(ids, mask)
        return out, time.perf_counter() - started

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Iterator[tuple[int, float]]:
        _, compute = self.embed([prompt_ids])
        yield 0, compute

    def lm_eval_model(self, batch_size: int):
        raise NotImplementedError("an encoder is scored by retrieval and cosine (experiments/judge/embedding_eval.py), "
                                  "not by lm-eval")


class MeanPooled(torch.nn.Module):
    """The encoder plus sentence-transformers' mean pooling and normalisation, as one module to run or export.

    The mask goes in as a 4D additive bias: transformers 5 builds its own mask with ops the ONNX tracer cannot
    follow, and returns a 4D mask as given."""

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        dtype = self.encoder.dtype
        bias = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
        hidden = self.encoder(input_ids=input_ids, attention_mask=bias).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)


def load_pooled(model_dir: Path, dtype: torch.dtype = torch.float32) -> MeanPooled:
    from transformers import AutoModel  # heavy

    # eager attention takes the additive mask as is (and traces to plain ONNX ops)
    model = AutoModel.from_pretrained(model_dir, dtype=dtype, use_safetensors=True, attn_implementation="eager")
    return MeanPooled(model.eval()).eval()
