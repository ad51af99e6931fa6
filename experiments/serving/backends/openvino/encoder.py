"""OpenVINO runs the encoder (target kind `embedding`): the fp32 ONNX export converted to OpenVINO IR with plain
`openvino` (no optimum-intel: it pulls torchvision, which replaces the pinned CPU torch), weights compressed by
NNCF as the recipe says, compiled for the CPU.

int8: NNCF INT8_ASYM, per output channel (uint8 weights, a scale and a zero point each);
int4: NNCF INT4_SYM in groups of 32 with a scale each (NNCF keeps the embeddings and the last MatMul at int8).
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from experiments.core.artefacts import cached, weights_digest
from experiments.core.recipe import Candidate, Recipe
from experiments.serving.backends.onnxruntime.encoder import export_onnx
from experiments.serving.encoder_engine import EXPORT_VERSION, EncoderEngine, encoder_refusal
from experiments.serving.engine import torch_only

# ops between a compressed weight constant and its MatMul (NNCF's decompression subgraph)
DECOMPRESSION_OPS = {"Convert", "Subtract", "Multiply", "Reshape", "Transpose"}


def openvino_refusal(recipe: Recipe) -> str | None:
    """What neither OpenVINO engine here runs: they compile for the CPU plugin, in f32 (its precision hint, for
    parity with torch), weights compressed by NNCF."""
    if reason := torch_only(recipe):
        return reason
    if recipe.execution_provider != "cpu":
        return (f"the OpenVINO engines here run on its CPU plugin; the champion runs on "
                f"{recipe.execution_provider} (target.device), and an engine swap does not move the model")
    if recipe.precision != "fp32" or recipe.quantization not in ("none", "int8", "int4"):
        return (f"the OpenVINO engines here run fp32 activations with none/int8/int4 weights (NNCF), not "
                f"{recipe.precision}/{recipe.quantization}")
    if recipe.batching == "continuous":
        return ("continuous batching is a torch path here (or onnxruntime-genai's on CUDA); OpenVINO serves one "
                "request or a padded batch per forward pass")
    return None


def compression_args(quantization: str) -> dict | None:
    import nncf  # heavy

    return {"none": None,
            "int8": {"mode": nncf.CompressWeightsMode.INT8_ASYM},
            "int4": {"mode": nncf.CompressWeightsMode.INT4_SYM, "group_size": 32, "ratio": 1.0}}[quantization]


def cached_ir(cand: Candidate, artefact_root: Path, kind: str, convert, **key) -> tuple[Path, bool]:
    """IR of `kind` (encoder | llm) for the recipe — fp32 activations, none/int8/int4 weights by NNCF — built
    by `convert(folder)` unless a valid one is cached under the same content key; (model.xml, reused)."""
    import nncf  # heavy
    import openvino as ov  # heavy
    import transformers  # heavy

    recipe = cand.recipe
    recipe_key = {"weights": weights_digest(cand.target.model_dir), "quantization": recipe.quantization,
                  "openvino": ov.__version__, "nncf": nncf.__version__, "torch": torch.__version__,
                  "transformers": transformers.__version__, **key}
    folder, reused = cached(artefact_root, f"openvino-{kind}-{recipe.quantization}", recipe_key, convert)
    return folder / "model.xml", reused


def export_ir(cand: Candidate, artefact_root: Path) -> tuple[Path, bool]:
    """The encoder as OpenVINO IR, from its fp32 ONNX export; (model.xml, reused)."""
    return cached_ir(cand, artefact_root, "encoder", lambda tmp: _convert(cand, artefact_root, tmp),
                     export=EXPORT_VERSION)


def _convert(cand: Candidate, artefact_root: Path, tmp: Path) -> None:
    import nncf  # heavy
    import openvino as ov  # heavy

    fp32_onnx, _ = export_onnx(Candidate(cand.target, replace(cand.recipe, quantization="none")), artefact_root)
    model = ov.convert_model(str(fp32_onnx))
    args = compression_args(cand.recipe.quantization)
    if args:
        model = nncf.compress_weights(model, **args)
    # save_model halves float weights to fp16 unless told not to: fp32 must stay fp32 for parity
    ov.save_model(model, str(tmp / "model.xml"), compress_to_fp16=False)


def ir_weight_bits(model) -> float:
    """Stored bits per weight of the MatMul weights: every constant of a weight's decompression subgraph (packed
    int8/int4 data, scales, zero points) over the weights it stands for; a plain float constant at its dtype.
    INT8 per channel lands near 8.1, INT4 in groups of 32 near 4.5, fp32 at 32."""
    stored, weights = 0, 0
    for op in model.get_ops():
        if op.get_type_name() != "MatMul":
            continue
        constants, pending = [], [op.input_value(1).get_node()]
        while pending:
            node = pending.pop()
            kind = node.get_type_name()
            if kind == "Constant":
                constants.append(node)
            elif kind in DECOMPRESSION_OPS:
                # Reshape's and Transpose's second input is a shape or an order, not weight data
                inputs = node.input_values()[:1] if kind in ("Reshape", "Transpose") else node.input_values()
                pending += [value.get_node() for value in inputs]
            else:   # an activation (attention's Q x K): not a weight
                constants = []
                break
        if constants:
            stored += sum(int(np.prod(c.get_output_shape(0))) * c.get_output_element_type(0).bitwidth
                          for c in constants)
            weights += int(np.prod(op.input(1).get_shape()))
    return stored / max(1, weights)


class CompiledIR:
    """An IR read and compiled for the CPU, and the time that took (what a rebuild from cache costs)."""

    def __init__(self, path: Path, threads: int):
        import openvino as ov  # heavy

        loading = time.perf_counter()
        core = ov.Core()
        self.model = core.read_model(str(path))
        # without the f32 hint the CPU plugin runs bf16 where the chip has it, and parity with torch is lost
        self.compiled = core.compile_model(self.model, "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                    "INFERENCE_NUM_THREADS": threads})
        self.request = self.compiled.create_infer_request()
        self.load_seconds = time.perf_counter() - loading


class OpenVinoEncoder(EncoderEngine):
    name = "openvino"

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        return encoder_refusal(cand.recipe) or openvino_refusal(cand.recipe)

    def __init__(self, cand: Candidate, threads: int, artefact_root: Path):
        self.require_buildable(cand)
        self.recipe = cand.recipe
        started = time.perf_counter()
        self.path, self.reused = export_ir(cand, artefact_root)
        self.build_seconds = time.perf_counter() - started
        self.ir = CompiledIR(self.path, threads)   # kept: the request needs its compiled model alive
        self.model, self.request, self.load_seconds = self.ir.model, self.ir.request, self.ir.load_seconds

    def rebuild_seconds(self) -> float:
        return self.load_seconds

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        out = self.request.infer({"input_ids": ids, "attention_mask": mask}, share_outputs=False)
        return np.asarray(out[0], dtype=np.float32)

    def artefact_paths(self) -> list[Path]:
        return [self.path, self.path.with_suffix(".bin")]

    def weight_bits(self) -> float:
        return ir_weight_bits(self.model)
