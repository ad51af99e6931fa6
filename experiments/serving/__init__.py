"""Engines that run a candidate's recipe: which class builds it depends on the target's kind and the recipe's
engine (a causal LM decodes step by step; an encoder runs one forward pass per batch). Each kind names its
engine classes (experiments/targets/kinds)."""
from __future__ import annotations

from importlib import import_module
from pathlib import Path

from experiments.core.recipe import Candidate
from experiments.serving.backends.served import ServedEngine
from experiments.serving.engine import Engine
from experiments.targets.kinds import kind_of


def engine_class(cand: Candidate) -> type[Engine]:
    """The class that builds the candidate's recipe; a recipe engine spelled "module:Class" names a class of one's
    own (constructed as every engine is: cand, threads, artefact_root). ValueError when there is none."""
    if ":" in cand.recipe.engine:
        module, cls = cand.recipe.engine.split(":")
        return getattr(import_module(module), cls)
    kind = kind_of(cand.target.kind)
    path = kind.engine(cand.recipe)
    if path is None:
        raise ValueError(f"no {cand.recipe.engine!r} engine for a {cand.target.kind} target; known: "
                         f"{', '.join(kind.engines)}")
    module, cls = path.split(":")
    return getattr(import_module(module), cls)


def refusal(cand: Candidate) -> str | None:
    """Why no engine here builds the candidate's recipe, or None: the engine's own answer (Engine.refuses)."""
    try:
        cls = engine_class(cand)
    except ValueError as no_engine:
        return str(no_engine)
    if not issubclass(cls, ServedEngine) and (reason := served_only(cand.recipe)):
        return reason
    formats = getattr(cls, "weight_formats", ())   # ServedEngine.weight_formats
    if (fmt := cand.recipe.weight_format) and fmt not in formats:
        return f"{cls.name} serves no {fmt} weights (its formats to choose: {', '.join(formats) or 'none'})"
    return cls.refuses(cand)


def fixed_kv_budget(cand: Candidate) -> bool:
    """Whether the candidate's engine sizes its KV pool from a fixed budget whatever the batch or KV type
    (ServedEngine.fixed_kv_budget): fewer sequences or bits buy room, not memory."""
    return getattr(engine_class(cand), "fixed_kv_budget", False)


def served_only(recipe) -> str | None:
    """What only a serving engine's own server does here: KV-cache types, speculative decoding, parallelism."""
    r, where = recipe, f"the champion runs {recipe.engine}, in process"
    if r.kv_cache_dtype != "auto":
        return f"a {r.kv_cache_dtype} KV cache is a serving engine's setting (vLLM, llama.cpp); {where}"
    if r.speculative != "none":
        return f"{r.speculative} speculative decoding is a serving engine's setting (vLLM, llama.cpp); {where}"
    if r.devices_per_replica > 1:
        return f"tensor and pipeline parallelism are vLLM's, SGLang's and TensorRT-LLM's; {where}"
    return None


def continuous_changes(cand: Candidate, scheduler: str) -> dict:
    """The recipe changes that make the candidate batch continuously: its own engine's way where it has one
    (Engine.batches_continuously), else `scheduler` over the torch model."""
    try:
        own = engine_class(cand).batches_continuously(cand.recipe, scheduler)
    except ValueError:
        own = None
    return own if own is not None else {"engine": "torch", "scheduler": scheduler}


def build_engine(cand: Candidate, threads: int, artefact_root: Path) -> Engine:
    """The engine for the candidate's recipe; its constructor refuses a recipe it cannot build. An in-process
    engine is given the threads its recipe says; a server reads its recipe beside the sweep's `threads`."""
    cls = engine_class(cand)
    return cls(cand, threads if issubclass(cls, ServedEngine) else cls.compute_threads(cand.recipe, threads),
               artefact_root)
