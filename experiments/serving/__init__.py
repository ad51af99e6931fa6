"""Engines that run a candidate's recipe: which class builds it depends on the target's kind and the recipe's
engine (a causal LM decodes step by step; an encoder runs one forward pass per batch)."""
from __future__ import annotations

from importlib import import_module
from pathlib import Path

from experiments.serving.engine import Engine
from optimizers.base import Candidate

# (target kind, recipe engine) -> "module:class"; the class takes (cand, threads[, artefact_root]).
ENGINES = {
    ("causal-lm", "torch"): "experiments.serving.torch_engine:TorchEngine",
    ("causal-lm", "onnxruntime"): "experiments.serving.ort_engine:OrtGenaiEngine",
    ("causal-lm", "openvino"): "experiments.serving.openvino_llm:OpenVinoCausalLM",
    ("embedding", "torch"): "experiments.serving.encoder:TorchEncoder",
    ("embedding", "onnxruntime"): "experiments.serving.encoder:OrtEncoder",
    ("embedding", "openvino"): "experiments.serving.openvino_encoder:OpenVinoEncoder",
}
NEEDS_ARTEFACTS = {"onnxruntime", "openvino"}
# a causal LM in torch with recipe.cuda_graph: the decode step replayed from a captured graph
CUDA_GRAPH_ENGINE = "experiments.serving.cuda_graph_engine:CudaGraphEngine"


def engine_class(cand: Candidate) -> type[Engine]:
    """The class that builds the candidate's recipe; a recipe engine spelled "module:Class" names a class of one's
    own (constructed like the built-in torch engine: cand, threads). ValueError when there is none."""
    if ":" in cand.recipe.engine:
        module, cls = cand.recipe.engine.split(":")
        return getattr(import_module(module), cls)
    key = (cand.target.kind, cand.recipe.engine)
    if key not in ENGINES:
        known = ", ".join(e for k, e in ENGINES if k == cand.target.kind)
        raise ValueError(f"no {cand.recipe.engine!r} engine for a {cand.target.kind} target; known: {known}")
    graphed = cand.recipe.cuda_graph and key == ("causal-lm", "torch")
    module, cls = (CUDA_GRAPH_ENGINE if graphed else ENGINES[key]).split(":")
    return getattr(import_module(module), cls)


def refusal(cand: Candidate) -> str | None:
    """Why no engine here builds the candidate's recipe, or None: the engine's own answer (Engine.refuses)."""
    try:
        return engine_class(cand).refuses(cand)
    except ValueError as no_engine:
        return str(no_engine)


def build_engine(cand: Candidate, threads: int, artefact_root: Path) -> Engine:
    """The engine for the candidate's recipe; its constructor refuses a recipe it cannot build."""
    cls = engine_class(cand)
    if cand.recipe.engine in NEEDS_ARTEFACTS:
        return cls(cand, threads, artefact_root)
    return cls(cand, threads)
