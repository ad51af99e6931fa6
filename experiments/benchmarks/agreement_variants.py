"""Known answers for make bench-agreement: harmless changes a generation-agreement check must pass and broken
engines it must fail, each a real perturbation of the fp32 torch model, served as TorchEngine serves it (greedy
decode step by step over a DynamicCache) and scored through the same forward (fidelity.logprob_scorer).

Broken ones hit different paths on purpose: some the forward itself (seen by teacher-forced scoring too), some
only the decode steps (a truncated KV cache, positions that restart after the prefill), which a single forward
over prompt + answer never exercises."""
from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache

from experiments.serving.backends.pytorch.quantize import quantize


class VariantEngine:
    """A causal LM decoded greedily with a KV cache, with a fault (or a harmless change) put in."""
    name = "torch"

    def __init__(self, model, *, positions: Callable | None = None, decode_positions: Callable | None = None,
                 cache_window: int | None = None, non_causal: bool = False):
        self.model = model.eval()
        self.positions = positions                # (cache_position) -> position_ids, every forward
        self.decode_positions = decode_positions  # (cache_position, prompt_len) -> position_ids, decode steps
        self.cache_window = cache_window          # keep only the last W cached positions after each step
        self.non_causal = non_causal              # prefill / scoring attends to later tokens too

    def serving_forward(self, input_ids, use_cache=False, past_key_values=None, cache_position=None,
                        position_ids=None):
        n = input_ids.shape[1]
        if cache_position is None:
            cache_position = torch.arange(n)
        kwargs = {}
        if position_ids is None and self.positions is not None:
            position_ids = self.positions(cache_position)
        if position_ids is not None:
            kwargs["position_ids"] = position_ids.unsqueeze(0)
        if self.non_causal and n > 1:
            past = int(cache_position[0])
            kwargs["attention_mask"] = torch.ones(1, 1, n, past + n, dtype=torch.bool)
        return self.model(input_ids=input_ids, use_cache=use_cache, past_key_values=past_key_values,
                          cache_position=cache_position, **kwargs)

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], max_new_tokens: int):
        cache = DynamicCache(config=self.model.config)
        step_input = torch.tensor([prompt_ids], dtype=torch.long)
        position = torch.arange(len(prompt_ids))
        for i in range(max_new_tokens):
            started = time.perf_counter()
            pos = self.decode_positions(position, len(prompt_ids)) if i and self.decode_positions else None
            logits = self.serving_forward(step_input, True, cache, position, pos).logits
            token = int(logits[0, -1].argmax())
            yield token, time.perf_counter() - started
            if self.cache_window:
                w = self.cache_window
                for layer in cache.layers:
                    layer.keys, layer.values = layer.keys[:, :, -w:], layer.values[:, :, -w:]
            step_input = torch.tensor([[token]], dtype=torch.long)
            position = position[-1:] + 1

    def close(self) -> None:
        pass


class _Skip(torch.nn.Module):
    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states


def _copy(model):
    return copy.deepcopy(model)


def int8_weight_only(model):
    """Decoder linear weights rounded to int8, symmetric per output channel (as ONNX Runtime's and torchao's
    int8 weight-only schemes store them), computed in fp32."""
    m = _copy(model)
    with torch.no_grad():
        for layer in m.model.layers.modules():
            if isinstance(layer, torch.nn.Linear):
                w = layer.weight
                scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
                w.copy_(torch.round(w / scale).clamp(-127, 127) * scale)
    return VariantEngine(m)


def int8_dynamic(model):
    """The torch int8 rung on CPU: per-tensor int8 weights and activations quantized per step."""
    m = _copy(model)
    quantize(m, "int8", torch.device("cpu"))
    return VariantEngine(m)


def bf16(model):
    return VariantEngine(_copy(model).to(torch.bfloat16))


def eager_attention(model):
    """The same weights through the eager attention kernels instead of SDPA: an exact engine swap."""
    m = _copy(model)
    m.set_attn_implementation("eager")
    return VariantEngine(m)


def dropped_layer(model):
    m = _copy(model)
    layers = m.model.layers
    layers[len(layers) // 2] = _Skip()
    return VariantEngine(m)


def shuffled_vocabulary(model, share: float = 0.1, seed: int = 0):
    """A slice of the vocabulary's embedding (and head) rows permuted: ids mapped to other tokens' vectors."""
    m = _copy(model)
    vocab = m.get_input_embeddings().weight.shape[0]
    start, size = vocab // 8, max(2, int(vocab * share))
    perm = start + torch.randperm(size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for weight in {id(w): w for w in (m.get_input_embeddings().weight, m.get_output_embeddings().weight)}.values():
            weight[start:start + size] = weight[perm].clone()
    return VariantEngine(m)


def halved_positions(model):
    """Rotary positions computed as position // 2 (every forward): wrong relative distances."""
    return VariantEngine(_copy(model), positions=lambda cache_position: cache_position // 2)


def decode_positions_restart(model):
    """The decode steps' rotary positions restart at 0 after the prefill (the cache offset forgotten)."""
    return VariantEngine(_copy(model), decode_positions=lambda position, prompt_len: position - prompt_len)


def no_causal_mask(model):
    """The prefill (and any multi-token forward) attends to later tokens: the causal mask left out."""
    return VariantEngine(_copy(model), non_causal=True)


def truncated_cache(model, window: int = 8):
    """The KV cache keeps only its last `window` positions: decode steps lose the prompt."""
    return VariantEngine(_copy(model), cache_window=window)


HARMLESS = {"int8 weight-only": int8_weight_only, "bf16 (torch)": bf16, "eager attention (exact swap)": eager_attention}
BROKEN = {"dropped middle layer": dropped_layer, "shuffled 10 % vocabulary slice": shuffled_vocabulary,
          "rotary positions halved": halved_positions, "decode positions restart at 0": decode_positions_restart,
          "no causal mask in prefill": no_causal_mask, "KV cache truncated to 8": truncated_cache}
# No known answer: measured for what it shows (its fidelity KL beside it).
OTHER = {"int8 dynamic (torch rung)": int8_dynamic}
