"""Weight quantization of a torch model's decoder layers (the tied embedding doubles as the input lookup, so it
stays), and the proof that it happened: a scheme that leaves weights as they were raises instead of being
measured under the scheme's name.

CPU: torch's dynamic int8 Linear (fp32 only). CUDA: torchao 0.18 — int8 weight-only, float8 dynamic, and int4
in the tile-packed layout of torch's own tinygemm kernel (bf16 only, and no `mslk` package needed)."""
from __future__ import annotations

import torch

SCHEMES = ("int8", "int4", "fp8")


def torch_refusal(scheme: str, precision: str, device_type: str, compile_mode: str = "none") -> str | None:
    """Why torch cannot run a model held at `precision` on `device_type` (compiled with `compile_mode`) with
    its weights quantized as `scheme`, or None."""
    if precision == "fp16" and device_type == "cpu":
        # it would build, but few of torch's CPU kernels run fp16: a poor candidate, not a technique
        return "torch has few fp16 CPU kernels; on the CPU torch runs bf16 (half_precision's cpu_dtype: bf16)"
    if scheme == "none":
        return None
    if scheme not in SCHEMES:
        return f"torch engine has no {scheme!r} path; known: none, {', '.join(SCHEMES)}"
    if scheme == "fp8" and device_type != "cuda":
        return "FP8 needs a CUDA device (torchao float8 kernels); the champion runs on CPU"
    if scheme == "int4" and device_type != "cuda":
        return "torchao Int4WeightOnly has no CPU kernel here; INT4 on CPU runs in onnxruntime (MatMulNBits)"
    if scheme == "int8" and device_type == "cpu" and precision != "fp32":
        return (f"torch's dynamic int8 Linear quantizes fp32 weights and takes fp32 activations; the champion runs "
                f"{precision} (its other layers would feed it {precision}): int8 in torch on CPU needs an fp32 "
                f"champion (ONNX Runtime and OpenVINO quantize from the fp32 export)")
    if scheme == "int8" and device_type == "cpu" and compile_mode != "none":
        return (f"torch's dynamic int8 Linear (torch.ao) breaks dynamo's graph at every projection: compiled "
                f"({compile_mode}), the decode recompiles past dynamo's limit (FailOnRecompileLimitHit, seen on the "
                f"built-in model); int8 on CPU runs in ONNX Runtime or OpenVINO, or on an eager torch champion")
    if scheme == "int4" and device_type == "cuda" and precision != "bf16":
        return (f"torchao's int4 kernel here (tinygemm, tile-packed layout) computes in bf16 only; the champion "
                f"runs {precision}: set the half_precision rung's cuda_dtype: bf16")
    return None


def quantize(model, quantization: str, device: torch.device) -> None:
    """Quantizes in place a model whose engine has checked torch_refusal for its recipe."""
    if quantization == "none":
        return
    if quantization == "int8" and device.type == "cpu":
        model.model.layers = torch.ao.quantization.quantize_dynamic(model.model.layers, {torch.nn.Linear},
                                                                    dtype=torch.qint8)
        return
    quantize_torchao(model.model.layers, quantization)


def quantize_torchao(layers: torch.nn.Module, quantization: str) -> None:
    from torchao.quantization import (  # optional
        Float8DynamicActivationFloat8WeightConfig,
        Int4WeightOnlyConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    configs = {"int8": Int8WeightOnlyConfig,
               "int4": lambda: Int4WeightOnlyConfig(group_size=32, int4_packing_format="tile_packed_to_4d"),
               "fp8": Float8DynamicActivationFloat8WeightConfig}
    if quantization not in configs:
        raise ValueError(f"torch engine has no {quantization!r} path; known: none, {', '.join(configs)}")
    quantize_(layers, configs[quantization]())
    require_quantized(layers, quantization)


def require_quantized(layers: torch.nn.Module, quantization: str) -> None:
    """torchao swaps each Linear weight for a tensor subclass; it returns the weight untouched when it skips one
    (a shape its group size does not divide, for one), without an error."""
    linears = {name: m for name, m in layers.named_modules() if isinstance(m, torch.nn.Linear)}
    plain = [name for name, m in linears.items() if type(m.weight) in (torch.Tensor, torch.nn.Parameter)]
    if not linears or plain:
        raise RuntimeError(f"torchao {quantization} left {len(plain)} of {len(linears)} Linear weights unquantized "
                           f"({', '.join(plain[:4])}{', ...' if len(plain) > 4 else ''}): not measured as "
                           f"{quantization}")
