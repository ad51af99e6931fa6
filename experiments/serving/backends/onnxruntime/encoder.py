"""The ONNX Runtime encoder engine: the pooled model exported to ONNX once (cached by content), fp32 with
int8 or int4 weights."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from experiments.core.artefacts import cached, weights_digest
from experiments.core.gpu_guards import ort_providers, require_provider
from experiments.core.recipe import Candidate
from experiments.serving.backends.onnxruntime.causal_lm import graph_weight_bits
from experiments.serving.encoder_engine import EXPORT_VERSION, EncoderEngine, encoder_refusal, load_pooled
from experiments.serving.engine import torch_only


def export_onnx(cand: Candidate, artefact_root: Path) -> tuple[Path, bool]:
    """The pooled encoder as ONNX (fp32), quantized as the recipe says, cached by content; (model.onnx, reused).

    int8: ONNX Runtime's dynamic quantization (int8 weights with a scale per output channel — per tensor loses
    ~3 points of cosine on MiniLM — activations quantized per batch: MatMulInteger);
    int4: MatMulNBits, 4-bit weights in blocks of 32 with a scale each."""
    import onnxruntime  # heavy
    import transformers  # heavy

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
        from onnxruntime.quantization import QuantType, quantize_dynamic  # heavy

        quantize_dynamic(str(fp32), str(tmp / "model.onnx"), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul"], per_channel=True)
    elif quantization == "int4":
        import onnx  # heavy
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer  # heavy

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
        import onnxruntime as ort  # heavy

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
