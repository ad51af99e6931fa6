"""ONNX Runtime through onnxruntime-genai: the builder exports (and quantizes) the model, its C++ loop decodes."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from experiments.core.artefacts import cached, model_identity
from experiments.core.gpu_guards import ort_providers, require_genai_device
from experiments.core.recipe import Candidate
from experiments.judge.accuracy import OnnxSessionLM
from experiments.serving.engine import Engine, torch_only, unpaged_prefix

QUANTIZED_PRECISION = {"int8": "int8", "int4": "int4"}


def builder_options(recipe) -> tuple[str, list[str]]:
    """The builder's precision flag and extra options for a recipe."""
    precision = QUANTIZED_PRECISION.get(recipe.quantization, recipe.precision)
    extra = []
    if recipe.batching == "continuous":
        # The continuous-batching Engine needs PagedAttention (a paged KV cache of num_blocks x block_size).
        extra = ["use_paged_attention=true", f"paged_block_size={recipe.kv_block_size}",
                 f"max_batch_size={recipe.max_batch}"] + (
            [f"num_blocks={recipe.kv_num_blocks}"] if recipe.kv_num_blocks else [])
    return precision, extra


def export(cand: Candidate, artefact_root: Path, timeout_s: float = 900) -> tuple[Path, bool]:
    """Build (or reuse) the ONNX model for `cand`; returns (folder, reused)."""
    import onnxruntime_genai  # heavy

    recipe = cand.recipe
    precision, extra = builder_options(recipe)
    key = {"source": model_identity(cand.target.model_dir), "precision": precision, "extra": extra, "ep": recipe.execution_provider,
           "genai": onnxruntime_genai.__version__}
    return cached(artefact_root, f"ort-{precision}", key, lambda tmp: _build(cand, precision, extra, tmp, timeout_s))


def _build(cand: Candidate, precision: str, extra: list[str], tmp: Path, timeout_s: float) -> None:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(cand.target.model_dir),
           "-o", str(tmp), "-p", precision, "-e", cand.recipe.execution_provider,
           "-c", str(tmp) + ".cache"] + (["--extra_options", *extra] if extra else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    shutil.rmtree(str(tmp) + ".cache", ignore_errors=True)
    if proc.returncode != 0 or not (tmp / "genai_config.json").exists():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"onnxruntime-genai builder failed (exit {proc.returncode}):\n{tail}")


class OrtGenaiEngine(Engine):
    name = "onnxruntime"

    @classmethod
    def refuses(cls, cand: Candidate) -> str | None:
        recipe = cand.recipe
        if reason := torch_only(recipe) or unpaged_prefix(recipe):
            return reason
        if recipe.quantization == "fp8":
            return "onnxruntime-genai has no FP8 weight path"
        if recipe.quantization not in ("none", *QUANTIZED_PRECISION):
            return f"onnxruntime engine has no {recipe.quantization!r} path"
        if recipe.quantization == "none" and recipe.precision == "bf16" and recipe.execution_provider == "cpu":
            return ("ONNX Runtime's CPU kernels cannot run the bf16 export (no bf16 Where kernel); set "
                    "cpu_dtype: fp16 to try ONNX Runtime fp16, or run bf16 in the torch engine")
        if recipe.prefix_caching:
            return f"onnxruntime-genai's paged engine ({recipe.engine}) has no prefix sharing"
        if recipe.batching == "continuous" and recipe.execution_provider != "cuda":
            return ("onnxruntime-genai's CPU Engine batches statically only; continuous batching on the CPU is a "
                    "scheduler over the torch model")
        if recipe.batching == "continuous" and recipe.quantization == "none" and recipe.precision == "fp32":
            return "onnxruntime-genai's PagedAttention runs fp16 or bf16 only, not fp32"
        if recipe.execution_provider == "cuda" and recipe.cuda_device != 0:
            return (f"onnxruntime-genai places the model on the first CUDA device it sees, not cuda:"
                    f"{recipe.cuda_device}: run with CUDA_VISIBLE_DEVICES={recipe.cuda_device} and "
                    f"target.device=cuda")
        return None

    @classmethod
    def batches_continuously(cls, recipe, scheduler: str) -> dict | None:
        """On CUDA its paged engine (PagedAttention) does, in fp16 or bf16; its CPU Engine batches statically."""
        if recipe.execution_provider != "cuda":
            return None
        return {} if recipe.precision in ("fp16", "bf16") else {"precision": "fp16"}

    def __init__(self, cand: Candidate, threads: int, artefact_root: Path):
        import onnxruntime_genai as og  # heavy
        from transformers import AutoTokenizer  # heavy

        self.require_buildable(cand)
        started = time.perf_counter()
        self.folder, self.reused = export(cand, artefact_root)
        self.build_seconds = time.perf_counter() - started
        self.recipe = cand.recipe
        self.threads = threads
        loading = time.perf_counter()
        self.model = og.Model(self._config())
        require_genai_device(self.model, self.recipe.execution_provider)
        self.load_seconds = time.perf_counter() - loading
        # The same tokenizer files as the source model (the builder copies them; we check they agree).
        self.tokenizer = AutoTokenizer.from_pretrained(cand.target.model_dir)

    def rebuild_seconds(self) -> float:
        """The export is cached by content hash now: a rebuild loads it."""
        return self.load_seconds

    def _config(self, engine_section: dict | None = None):
        import onnxruntime_genai as og  # heavy

        config = og.Config(str(self.folder))
        overlay = {"model": {"decoder": {"session_options": {"intra_op_num_threads": self.threads,
                                                               "inter_op_num_threads": 1}}}}
        if engine_section:
            # The Engine takes a per-turn minimum; a session-wide min_length is refused there.
            overlay |= {"engine": engine_section, "search": {"min_length": 0}}
        config.overlay(json.dumps(overlay))
        return config

    def step_engine(self):
        """onnxruntime-genai's Engine for this recipe's batching: paged dynamic batching for continuous,
        else a static batcher of max_batch sequences (a batch runs until its longest sequence ends)."""
        import onnxruntime_genai as og  # heavy

        if self.recipe.batching == "continuous":
            section = {"dynamic_batching": {"block_size": self.recipe.kv_block_size,
                                            "max_batch_size": self.recipe.max_batch}
                       | ({"num_blocks": self.recipe.kv_num_blocks} if self.recipe.kv_num_blocks else {})}
        else:
            section = {"static_batching": {"max_batch_size": self.recipe.max_batch}}
        return og.Engine(og.Model(self._config(section)))

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> Iterator[tuple[int, float]]:
        import onnxruntime_genai as og  # heavy

        params = og.GeneratorParams(self.model)
        total = len(prompt_ids) + max_new_tokens
        params.set_search_options(max_length=total, min_length=total, do_sample=False)
        gen = og.Generator(self.model, params)
        started = time.perf_counter()
        gen.append_tokens(np.asarray(prompt_ids, dtype=np.int32))   # prefill runs here
        for _ in range(max_new_tokens):
            if gen.is_done():
                break
            gen.generate_next_token()
            token = int(gen.get_next_tokens()[0])
            now = time.perf_counter()
            yield token, now - started
            started = time.perf_counter()

    def lm_eval_model(self, batch_size: int):
        return OnnxSessionLM(self.folder / "model.onnx", self.tokenizer, self.threads, ort_providers(self.recipe))

    def artefact_paths(self) -> list[Path]:
        return sorted(p for p in self.folder.iterdir() if p.name.startswith("model.onnx"))

    def weight_bits(self) -> float:
        return graph_weight_bits(self.folder / "model.onnx")


def graph_weight_bits(onnx_path: Path) -> float:
    """Stored bits per weight of the graph's MatMul weights: packed MatMulNBits data + scales + zero points over
    the K x N weights they stand for, plain float initializers at their dtype. An INT4 model lands near 4.5
    (4 bits plus a scale per block), INT8 near 8.5, fp32 at 32."""
    import onnx  # heavy
    from onnx import helper  # heavy

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    inits = {t.name: t for t in graph.initializer}

    def bits_of(name: str) -> int:
        t = inits.get(name)
        if t is None:
            return 0
        numel = 1
        for d in t.dims:
            numel *= d
        return numel * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize * 8

    stored, weights = 0, 0
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            stored += sum(bits_of(name) for name in node.input[1:4])
            weights += attrs["K"] * attrs["N"]
        elif node.op_type == "MatMulInteger" and node.input[1] in inits:   # dynamic int8: weight + zero point
            stored += sum(bits_of(name) for name in node.input[1:4:2])
            weights += bits_of(node.input[1]) // 8
        elif node.op_type == "MatMul" and node.input[1] in inits:
            numel = bits_of(node.input[1]) // (helper.tensor_dtype_to_np_dtype(inits[node.input[1]].data_type)
                                               .itemsize * 8)
            stored += bits_of(node.input[1])
            weights += numel
    return stored / max(1, weights)
