"""Whether a candidate's weights fit in this machine's memory at its recipe's dtype, decided before it is built.

The estimate: parameters (from the safetensors headers, else the weight files' size at the checkpoint's dtype)
times the bytes a parameter takes in the recipe (fp32 4, fp16/bf16 2, int8 and fp8 1, int4 0.5), times MARGIN
for activations, the KV cache and the runtime. Against: `hardware.memory_bytes` when set, else what the
recipe's device has free now (the CPU: psutil's available memory; a CUDA device: its free memory).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import psutil
import torch

from experiments.analyse.roofline import weight_and_kv_bytes
from experiments.core.errors import ConfigError
from experiments.core.recipe import Candidate, Recipe

ELEMENT_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                 "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
NATIVE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MARGIN = 1.2   # the weights plus 20 %: activations, KV cache, the runtime's own buffers
GIB = 2 ** 30


def parameter_count(model_dir: Path) -> int:
    """Parameters stored in the folder: the safetensors headers' shapes (no tensor is read), else the size of
    pytorch_model*.bin at the dtype config.json names (fp32 when it names none)."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return sum(_safetensors_count(f) for f in files)
    config = model_dir / "config.json"
    settings = json.loads(config.read_text()) if config.exists() else {}
    dtype = settings.get("dtype") or settings.get("torch_dtype") or "float32"
    size = sum(f.stat().st_size for f in model_dir.glob("pytorch_model*.bin"))
    return size // NATIVE_BYTES.get(str(dtype).removeprefix("torch."), 4)


def _safetensors_count(path: Path) -> int:
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    count = 0
    for name, tensor in header.items():
        if name != "__metadata__":
            n = 1
            for dim in tensor["shape"]:
                n *= int(dim)
            count += n
    return count


def bytes_per_parameter(recipe: Recipe) -> float:
    return weight_and_kv_bytes(recipe.precision, recipe.quantization)[0]


def needed_bytes(cand: Candidate) -> tuple[int, int]:
    """(parameters, bytes the candidate needs with the margin)."""
    params = parameter_count(cand.target.model_dir)
    return params, int(params * bytes_per_parameter(cand.recipe) * MARGIN)


def available_bytes(recipe: Recipe, setting) -> tuple[int, str]:
    """(bytes, where the figure comes from): hardware.memory_bytes when set, else the device's free memory now."""
    if setting is not None:
        return int(float(setting)), "hardware.memory_bytes"
    if recipe.execution_provider == "cuda":
        return int(torch.cuda.mem_get_info(recipe.cuda_device)[0]), f"free on cuda:{recipe.cuda_device}"

    return int(psutil.virtual_memory().available), "available RAM"


def refusal(cand: Candidate, setting=None) -> str | None:
    """Why the candidate's weights would not fit, with both figures; None when they fit."""
    params, needed = needed_bytes(cand)
    have, source = available_bytes(cand.recipe, setting)
    if needed <= have:
        return None
    recipe = cand.recipe
    dtype = recipe.quantization if recipe.quantization != "none" else recipe.precision
    return (f"the weights of {cand.target.name} need about {needed / GIB:.2f} GiB at {dtype} ({params / 1e6:.1f} M "
            f"parameters x {bytes_per_parameter(recipe):g} bytes, +{MARGIN - 1:.0%} for activations and the "
            f"runtime), more than the {have / GIB:.2f} GiB of memory here ({source})")


def check_baseline(cand: Candidate, setting=None) -> None:
    """The whole sweep refused, before the model is loaded, when the baseline would not fit."""
    if reason := refusal(cand, setting):
        raise ConfigError(f"the baseline cannot run here: {reason}",
                          "free memory or run on a machine with more, pick a smaller model, or set "
                          "hardware.memory_bytes if the figure here is wrong")
