"""Where the model runs, decided once before the baseline from `target.device`: auto | cpu | cuda | cuda:N.

Every rung then keeps the champion's device. A rung that moved the model to the GPU would be credited with the
move, not with its technique (a CPU->GPU move can hardly fail a performance gate)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from experiments.core.recipe import Candidate, Env, Recipe, Target

DEVICE = re.compile(r"(auto|cpu|cuda)(?::(\d+))?")
NATIVE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def resolve_device(setting: str, env: Env) -> tuple[str, int]:
    """(execution provider, CUDA device index) for a `target.device` setting on this machine; auto is the first
    CUDA device when there is one. Indices count the devices torch sees (after CUDA_VISIBLE_DEVICES)."""
    match = DEVICE.fullmatch(str(setting).strip())
    if not match or (match[2] is not None and match[1] != "cuda"):
        raise ValueError(f"target.device must be auto, cpu, cuda or cuda:N, got {setting!r}")
    kind, index = match[1], int(match[2] or 0)
    if kind == "auto":
        return ("cuda", 0) if env.cuda else ("cpu", 0)
    if kind == "cpu":
        return "cpu", 0
    if not env.cuda:
        raise ValueError(f"target.device={setting} but no CUDA device is present (torch.cuda.is_available() is False)")
    if index >= env.cuda_device_count:
        raise ValueError(f"target.device={setting} but torch sees {env.cuda_device_count} CUDA device(s) "
                         f"(cuda:0..cuda:{env.cuda_device_count - 1}, counted after CUDA_VISIBLE_DEVICES)")
    return "cuda", index


def placed(target: Target, device: str, env: Env) -> Candidate:
    """The candidate the baseline starts from: the model on its device, nothing else decided yet."""
    provider, index = resolve_device(device, env)
    return Candidate(target, Recipe(execution_provider=provider, cuda_device=index))


def native_precision(model_dir: Path) -> str:
    """The dtype the checkpoint says it was saved in (config.json `dtype`, formerly `torch_dtype`); fp32 when it
    does not say or names another type."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return NATIVE.get(dtype.removeprefix("torch."), "fp32")
