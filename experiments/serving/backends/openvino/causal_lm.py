"""OpenVINO runs the causal LM: the torch model traced with plain `openvino` (no optimum-intel: it pulls
torchvision, which replaces the pinned CPU torch) as one decode step over an explicit KV cache, weights compressed
by NNCF as the recipe says (see openvino_encoder), compiled for the CPU; numpy drives the greedy loop.

Why the torch model and not onnxruntime-genai's export: OpenVINO's ONNX frontend reads that graph, but maps its
GroupQueryAttention to an internal op that IR cannot be saved with; traced from torch, attention becomes the
standard ScaledDotProductAttention op, which the CPU plugin runs as one kernel.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from experiments.core.recipe import Candidate
from experiments.judge.accuracy import OnnxSessionLM
from experiments.serving.backends.openvino.encoder import (
    CompiledIR,
    cached_ir,
    compression_args,
    ir_weight_bits,
    openvino_refusal,
)
from experiments.serving.engine import Engine, unpaged_prefix


def kv_names(num_layers: int, prefix: str) -> list[str]:
    """`prefix.<layer>.key`, `prefix.<layer>.value` in layer order (onnxruntime-genai's naming)."""
    return [f"{prefix}.{i}.{kv}" for i in range(num_layers) for kv in ("key", "value")]


def export_ir(cand: Candidate, artefact_root: Path) -> tuple[Path, bool]:
    """The decode step as OpenVINO IR, traced from the torch model; (model.xml, reused)."""
    return cached_ir(cand, artefact_root, "llm",
                     lambda tmp: _convert(Path(cand.target.model_dir), cand.recipe.quantization, tmp))


def _convert(model_dir: Path, quantization: str, tmp: Path) -> None:
    import nncf  # heavy
    import openvino as ov  # heavy
    from transformers import AutoModelForCausalLM  # heavy

    # sdpa: attention traces to one aten::scaled_dot_product_attention, which OpenVINO keeps as a fused op
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, use_safetensors=True,
                                                 attn_implementation="sdpa").eval()
    layers, kv_heads, head_dim = cache_shape(model.config)
    # past of 3 and 2 new tokens: no dimension of the trace is 0 or 1, so none is specialised away
    example = (torch.ones(1, 2, dtype=torch.long), torch.ones(1, 5, dtype=torch.long),
               *[torch.zeros(1, kv_heads, 3, head_dim)] * (2 * layers))
    shapes = [([-1, -1], ov.Type.i64)] * 2 + [([-1, kv_heads, -1, head_dim], ov.Type.f32)] * (2 * layers)
    with torch.no_grad(), warnings.catch_warnings():
        # the tracer's warnings here are about values KvStep makes constant on purpose (the empty tensors it
        # overwrites, sdpa's is_causal with a mask given)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        ir = ov.convert_model(KvStep(model), example_input=example, input=shapes)
    for port, name in zip(ir.inputs, ["input_ids", "attention_mask", *kv_names(layers, "past_key_values")]):
        port.get_tensor().set_names({name})
    for port, name in zip(ir.outputs, ["logits", *kv_names(layers, "present")]):
        port.get_tensor().set_names({name})
    args = compression_args(quantization)
    if args:
        ir = nncf.compress_weights(ir, **args)
    # save_model halves float weights to fp16 unless told not to: fp32 must stay fp32 for parity
    ov.save_model(ir, str(tmp / "model.xml"), compress_to_fp16=False)


def cache_shape(config) -> tuple[int, int, int]:
    """(layers, KV heads, head size) of a decoder config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


class KvStep(torch.nn.Module):
    """One forward pass over plain tensors: (input_ids [B, S], attention_mask [B, past + S], past keys and values
    [B, H, past, D] per layer) -> (logits [B, S, vocab], present keys and values).

    Positions come from the mask (left padding works), and the causal mask goes in prepared (4D bool):
    transformers 5 builds its own with ops the tracer cannot follow, and returns a 4D mask as given."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor):
        from transformers import DynamicCache  # heavy

        positions = attention_mask.cumsum(-1) - 1
        query = positions[:, -input_ids.shape[1]:]
        allowed = (positions[:, None, None, :] <= query[:, None, :, None]) & attention_mask[:, None, None, :].bool()
        cache = DynamicCache(config=self.model.config)
        for layer, keys, values in zip(cache.layers, past[0::2], past[1::2]):
            # seeded directly: update() would concatenate onto an empty 1-D tensor, which OpenVINO rejects
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
        out = self.model(input_ids=input_ids, attention_mask=allowed, position_ids=query.clamp(min=0),
                         past_key_values=cache, use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])


class OpenVinoCausalLM(Engine):
    name = "openvino"

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        if reason := openvino_refusal(cand.recipe) or unpaged_prefix(cand.recipe):
            return reason
        if cand.recipe.batching in ("static", "dynamic"):
            return ("static and dynamic batching of a causal LM drive onnxruntime-genai's Engine; OpenVINO has none "
                    "here")
        return None

    def __init__(self, cand: Candidate, threads: int, artefact_root: Path):
        from transformers import AutoConfig, AutoTokenizer  # heavy

        self.require_buildable(cand)
        self.recipe = cand.recipe
        started = time.perf_counter()
        self.path, self.reused = export_ir(cand, artefact_root)
        self.build_seconds = time.perf_counter() - started
        self.ir = CompiledIR(self.path, threads)   # kept: the request needs its compiled model alive
        self.model, self.request, self.load_seconds = self.ir.model, self.ir.request, self.ir.load_seconds
        self.tokenizer = AutoTokenizer.from_pretrained(cand.target.model_dir)
        config = AutoConfig.from_pretrained(cand.target.model_dir)
        self.max_length = config.max_position_embeddings
        layers, kv_heads, head_dim = cache_shape(config)
        self.past_names, self.present_names = kv_names(layers, "past_key_values"), kv_names(layers, "present")
        self.empty_past = np.zeros((1, kv_heads, 0, head_dim), np.float32)

    def rebuild_seconds(self) -> float:
        """The IR is cached by content: a rebuild reads and compiles it."""
        return self.load_seconds

    def step(self, input_ids: list[int], past: list[np.ndarray] | None) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits [S, vocab] of the new tokens and the grown KV cache; past None starts a sequence."""
        past = past or [self.empty_past] * len(self.past_names)
        ids = np.asarray([input_ids], dtype=np.int64)
        mask = np.ones((1, past[0].shape[2] + ids.shape[1]), dtype=np.int64)
        # outputs copied: the present KV goes back in as the next step's past, and the request reuses its buffers
        out = self.request.infer({"input_ids": ids, "attention_mask": mask, **dict(zip(self.past_names, past))},
                                 share_outputs=False)
        return out["logits"][0], [out[name] for name in self.present_names]

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Iterator[tuple[int, float]]:
        step_input, past = list(prompt_ids), None
        for _ in range(max_new_tokens):
            started = time.perf_counter()
            logits, past = self.step(step_input, past)
            token = int(logits[-1].argmax())
            yield token, time.perf_counter() - started
            step_input = [token]

    def lm_eval_model(self, batch_size: int):
        return OpenVinoLM(self)

    def artefact_paths(self) -> list[Path]:
        return [self.path, self.path.with_suffix(".bin")]

    def weight_bits(self) -> float:
        return ir_weight_bits(self.model)


class OpenVinoLM(OnnxSessionLM):
    """OnnxSessionLM's lm-eval scoring, each sequence one forward pass of the engine's own compiled IR."""

    def __init__(self, engine: OpenVinoCausalLM):
        super(OnnxSessionLM, self).__init__()   # TemplateLM's: there is no ONNX session to open
        self.engine, self.tokenizer, self.max_length = engine, engine.tokenizer, engine.max_length

    def _logprobs(self, tokens: list[int]) -> np.ndarray:
        logits = self.engine.step(list(tokens), None)[0].astype(np.float64)
        return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
