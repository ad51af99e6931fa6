"""Engines that run a candidate's recipe."""
from __future__ import annotations

from pathlib import Path

from experiments.serving.engine import Engine
from optimizers.base import Candidate

ENGINES = ("torch", "onnxruntime")


def build_engine(cand: Candidate, threads: int, artefact_root: Path) -> Engine:
    engine = cand.recipe.engine
    if engine == "torch":
        from experiments.serving.torch_engine import TorchEngine
        return TorchEngine(cand, threads)
    if engine == "onnxruntime":
        from experiments.serving.ort_engine import OrtGenaiEngine
        return OrtGenaiEngine(cand, threads, artefact_root)
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
