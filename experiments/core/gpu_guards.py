"""Proof that a GPU technique took effect, or an error that says it did not.

Each library here has a quiet way out: torch-tensorrt's backend returns the unconverted graph when a conversion
fails, ONNX Runtime runs on the CPU when its CUDA provider does not load, torchao leaves a weight it skips as it
was (torch_quantize.py checks that one). Measured under the technique's name, any of them would credit a rung
with what it did not do; these checks turn them into failed rungs with the reason. (CUDA graphs are captured by
hand in cuda_graph_engine.py, where a capture that fails raises.)"""
from __future__ import annotations

import dataclasses

# pass_through_build_failures: raise on a failed conversion instead of returning the torch graph (default off).
# There is no precision option: torch-tensorrt 2.14 builds strongly typed engines from the graph's own dtypes
# (the recipe's precision), and `enabled_precisions` is no longer a setting (the backend would drop it silently).
TENSORRT_OPTIONS = {"pass_through_build_failures": True, "min_block_size": 1}


def tensorrt_options() -> dict:
    """The torch.compile options for torch-tensorrt's backend, each checked to be a setting of the installed
    release: the backend keeps the options it knows and drops the rest without a word."""
    import torch_tensorrt  # optional
    from torch_tensorrt.dynamo import CompilationSettings  # optional

    known = {f.name for f in dataclasses.fields(CompilationSettings)}
    if unknown := sorted(set(TENSORRT_OPTIONS) - known):
        raise RuntimeError(f"torch-tensorrt {torch_tensorrt.__version__} has no setting {', '.join(unknown)}: "
                           f"its backend would drop it silently (see experiments/core/gpu_guards.py)")
    return dict(TENSORRT_OPTIONS)


def ort_providers(recipe) -> list:
    """An InferenceSession's providers for the recipe's device: CUDA on its GPU first, the CPU for the nodes
    CUDA has no kernel for (ONNX Runtime assigns those per node)."""
    if recipe.execution_provider == "cuda":
        return [("CUDAExecutionProvider", {"device_id": recipe.cuda_device}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def require_provider(session, provider: str) -> None:
    """ONNX Runtime appends the CPU provider and uses it alone when the one asked for cannot load (onnxruntime
    instead of onnxruntime-gpu installed, CUDA or cuDNN libraries missing), with a warning in its log only."""
    active = session.get_providers()
    if provider not in active:
        raise RuntimeError(f"ONNX Runtime did not load {provider}; the session runs on {', '.join(active)} "
                           f"(is onnxruntime-gpu installed in place of onnxruntime, with its CUDA libraries?)")


def require_genai_device(model, device_type: str) -> None:
    """onnxruntime-genai's model says on which device it placed the decoder."""
    if str(model.device_type).lower() != device_type:
        raise RuntimeError(f"onnxruntime-genai placed the model on {model.device_type}, not {device_type} "
                           f"(is onnxruntime-genai-cuda installed in place of onnxruntime-genai?)")
