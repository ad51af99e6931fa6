"""The default target, built or loaded from the cache, and the candidates each bench compares."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

import experiments  # noqa: F401  (config resolvers)
from experiments.core.recipe import Candidate
from experiments.targets.resolve import resolve
from experiments.targets.workload import Workload
from optimizers.baseline import EagerBaseline
from optimizers.half_precision import HalfPrecision
from optimizers.onnxruntime_engine import OnnxRuntimeSwap
from optimizers.openvino_engine import OpenVinoSwap
from optimizers.quantization import WeightQuantization
from optimizers.torch_compile import TorchCompile


def compose_default(overrides=()):
    conf = str(Path(__file__).resolve().parents[2] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def default_setup(console, overrides=()):
    cfg = compose_default(overrides)
    target, texts, _ = resolve(cfg.target, Path(cfg.cache_dir), Path(cfg.data_dir), console.print)
    tok = AutoTokenizer.from_pretrained(target.model_dir)
    wl = cfg.target.workload
    workload = Workload.from_texts(texts, tok, wl.input_tokens, wl.output_tokens, wl.prompts, 16, cfg.seed,
                                   wl.get("shared_prefix_tokens", 0))
    base = EagerBaseline().apply(Candidate(target))
    ort, openvino = OnnxRuntimeSwap().apply(base), OpenVinoSwap().apply(base)
    cands = {"baseline": base, "torch.compile (inductor)": TorchCompile().apply(base),
             "bf16 (torch)": HalfPrecision().apply(base), "int8 (torch)": WeightQuantization("int8").apply(base),
             "onnxruntime": ort, "fp16 (onnxruntime)": HalfPrecision(cpu_dtype="fp16").apply(ort),
             "int8 (onnxruntime)": WeightQuantization("int8").apply(ort),
             "int4 (onnxruntime)": WeightQuantization("int4").apply(ort), "openvino": openvino,
             "int8 (openvino, NNCF)": WeightQuantization("int8").apply(openvino),
             "int4 (openvino, NNCF)": WeightQuantization("int4").apply(openvino)}
    return cands, workload, int(cfg.threads), Path(cfg.cache_dir) / "artefacts"
