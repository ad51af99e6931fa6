"""Weight quantization of a torch model's decoder layers (the tied embedding doubles as the input lookup, so it
stays), and the proof that it happened: a scheme that leaves weights as they were raises instead of being
measured under the scheme's name.

CPU: torch's dynamic int8 Linear (fp32 only). CUDA: torchao 0.18 — int8 weight-only, float8 dynamic, and int4
in the tile-packed layout of torch's own tinygemm kernel (bf16 only, and no `mslk` package needed)."""
from __future__ import annotations

import torch

from optimizers.quantization import torch_refusal

PRECISIONS = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def quantize(model, quantization: str, device: torch.device) -> None:
    if quantization == "none":
        return
    precision = PRECISIONS.get(model.dtype, str(model.dtype))
    if reason := torch_refusal(quantization, precision, device.type):
        raise ValueError(reason)
    if quantization == "int8" and device.type == "cpu":
        model.model.layers = torch.ao.quantization.quantize_dynamic(model.model.layers, {torch.nn.Linear},
                                                                    dtype=torch.qint8)
        return
    if device.type != "cuda":
        raise ValueError(f"torch {quantization} runs on CUDA only (torchao kernels); this engine is on {device}")
    quantize_torchao(model.model.layers, quantization)


def quantize_torchao(layers: torch.nn.Module, quantization: str) -> None:
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig, Int4WeightOnlyConfig,
                                      Int8WeightOnlyConfig, quantize_)

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
