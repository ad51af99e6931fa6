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

from experiments.core.artefacts import cached, weights_digest
from experiments.core.gpu_guards import ort_providers, require_provider
from experiments.core.recipe import Candidate, Recipe, device_name
from experiments.serving.engine import Engine, torch_only
from experiments.serving.ort_engine import graph_weight_bits
from experiments.serving.torch_engine import linear_weight_bits
from experiments.serving.torch_quantize import torch_refusal

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
    from transformers import AutoModel

    # eager attention takes the additive mask as is (and traces to plain ONNX ops)
    model = AutoModel.from_pretrained(model_dir, dtype=dtype, use_safetensors=True, attn_implementation="eager")
    return MeanPooled(model.eval()).eval()


class TorchEncoder(EncoderEngine):
    name = "torch"

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if reason := encoder_refusal(recipe):
            return reason
        if recipe.precision not in DTYPES:
            return f"torch encoder has no precision {recipe.precision!r}; known: {', '.join(DTYPES)}"
        if recipe.compile == "tensorrt":
            return "the TensorRT path compiles the decoder's torch graph; it is not built for encoders"
        if recipe.compile not in ("none", "inductor"):
            return f"torch encoder has no compile mode {recipe.compile!r}"
        if recipe.quantization != "none" and recipe.execution_provider == "cuda":
            return "the torch encoder quantizes on CPU only (dynamic int8); torchao's CUDA path is built for decoders"
        return torch_refusal(recipe.quantization, recipe.precision, recipe.execution_provider)

    def __init__(self, cand: Candidate, threads: int):
        self.require_buildable(cand)
        recipe = self.recipe = cand.recipe
        started = time.perf_counter()
        torch.set_num_threads(threads)
        self.device = torch.device(device_name(recipe))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)   # allocations without a device, and the NVML sampler, follow it
        self.model_dir = cand.target.model_dir
        self.model = load_pooled(self.model_dir, DTYPES[recipe.precision]).to(self.device)
        if recipe.quantization == "int8":   # on CPU: refuses() leaves no other scheme or device
            # the encoder's Linear layers, a scale per output channel (per tensor loses ~4 points of cosine
            # on MiniLM); the word embedding stays a float lookup
            self.model.encoder.encoder = torch.ao.quantization.quantize_dynamic(
                self.model.encoder.encoder, {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
                dtype=torch.qint8)
        self._forward = self.model
        if recipe.compile == "inductor":
            self._forward = torch.compile(self.model, dynamic=True)
            for width in (8, 64):   # compile now, not during the measured load
                self.embed([list(range(1, width + 1))] * 2)
        self.build_seconds = time.perf_counter() - started
        self.reused = False

    @torch.inference_mode()
    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        out = self._forward(torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device))
        return out.cpu().numpy()   # copies to host: compute time is real on a GPU too

    def artefact_paths(self) -> list[Path]:
        return sorted(Path(self.model_dir).glob("*.safetensors"))

    def weight_bits(self) -> float:
        return linear_weight_bits(self.model)


def export_onnx(cand: Candidate, artefact_root: Path) -> tuple[Path, bool]:
    """The pooled encoder as ONNX (fp32), quantized as the recipe says, cached by content; (model.onnx, reused).

    int8: ONNX Runtime's dynamic quantization (int8 weights with a scale per output channel — per tensor loses
    ~3 points of cosine on MiniLM — activations quantized per batch: MatMulInteger);
    int4: MatMulNBits, 4-bit weights in blocks of 32 with a scale each."""
    import onnxruntime
    import transformers

    recipe = cand.recipe
    recipe_key = {"weights": weights_digest(cand.target.model_dir), "quantization": recipe.quantization,
                  "ort": onnxruntime.__version__, "torch": torch.__version__,
                  "transformers": transformers.__version__, "export": EXPORT_VERSION}
    folder, reused = cached(artefact_root, f"ort-encoder-{recipe.quantization}", recipe_key,
                            lambda tmp: _export(cand, tmp))
    return folder / "model.onnx", reused


def _export(cand: Candidate, tmp: Path) -> None:
    quantization = cand.recipe.quantization
    fp32 = tmp / ("model.onnx" if quantization == "none" else "fp32.onnx")
    model = load_pooled(cand.target.model_dir)
    example = (torch.ones(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long))
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "embedding": {0: "batch"}}
    torch.onnx.export(model, example, str(fp32), input_names=["input_ids", "attention_mask"],
                      output_names=["embedding"], dynamic_axes=axes, opset_version=17, dynamo=False)
    if quantization == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(fp32), str(tmp / "model.onnx"), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul"], per_channel=True)
    elif quantization == "int4":
        import onnx
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quantizer = MatMulNBitsQuantizer(onnx.load(str(fp32)), block_size=32, is_symmetric=True, bits=4)
        quantizer.process()
        quantizer.model.save_model_to_file(str(tmp / "model.onnx"))
    if fp32.name != "model.onnx":
        fp32.unlink()


class OrtEncoder(EncoderEngine):
    name = "onnxruntime"

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if reason := encoder_refusal(recipe) or torch_only(recipe):
            return reason
        if recipe.precision != "fp32":
            return "the ONNX Runtime encoder engine runs its fp32 export only; bf16 runs in the torch engine"
        if recipe.quantization not in ("none", "int8", "int4"):
            return f"the onnxruntime encoder runs fp32 with none/int8/int4 weights, not fp32/{recipe.quantization}"
        return None

    def __init__(self, cand: Candidate, threads: int, artefact_root: Path):
        import onnxruntime as ort

        self.require_buildable(cand)
        self.recipe = cand.recipe
        started = time.perf_counter()
        self.path, self.reused = export_onnx(cand, artefact_root)
        self.build_seconds = time.perf_counter() - started
        loading = time.perf_counter()
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = ort.InferenceSession(str(self.path), options, providers=ort_providers(cand.recipe))
        if cand.recipe.execution_provider == "cuda":
            require_provider(self.session, "CUDAExecutionProvider")
        self.load_seconds = time.perf_counter() - loading

    def rebuild_seconds(self) -> float:
        return self.load_seconds

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]

    def artefact_paths(self) -> list[Path]:
        return sorted(p for p in self.path.parent.iterdir() if p.name.startswith("model.onnx"))

    def weight_bits(self) -> float:
        return graph_weight_bits(self.path)
