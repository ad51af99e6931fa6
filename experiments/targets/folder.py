"""A user's own Hugging Face folder (saved with `save_pretrained`) as a target: what it is, checked before any work.

The kind comes from the folder (experiments/targets/kinds: each kind says what its folders hold): a `*ForCausalLM`
architecture is a causal LM; a sentence-transformers folder (`modules.json`) or a bare encoder (`*Model`) is an
embedding model. Only architectures that the installed transformers ships are served: a folder whose config
maps to its own code (`auto_map`) would need `trust_remote_code`, which ROI Ladder never sets.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiments.core.errors import ConfigError
from experiments.targets import kinds
from experiments.targets.models.hf_folder import check_files, context_length, read_json


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    kind: str                 # a target kind's name (experiments/targets/kinds): causal-lm | embedding
    architecture: str
    context_length: int | None

    @property
    def default_name(self) -> str:
        return self.path.name


def inspect(path: Path, kind: str | None = None) -> ModelFolder:
    """The folder's kind (detected; `kind`, when given, must agree), architecture and context window."""
    path = Path(path).expanduser().resolve()
    check_files(path)
    config = read_json(path / "config.json")
    if "auto_map" in config:
        raise ConfigError(f"model folder {path} needs trust_remote_code: its config.json maps "
                          f"{', '.join(sorted(config['auto_map']))} to code shipped with the model",
                          "use a model whose architecture transformers ships (Llama, Qwen2/3, Mistral, Gemma, Phi, "
                          "BERT, ...); ROI Ladder never runs code that comes with a model")
    architectures = config.get("architectures") or []
    if not architectures:
        raise ConfigError(f"model folder {path}: config.json names no architecture",
                          "save the model with save_pretrained, which writes `architectures` into config.json")
    architecture = architectures[0]
    import transformers  # heavy

    if not hasattr(transformers, architecture):
        raise ConfigError(f"model folder {path}: architecture {architecture!r} is not shipped by transformers "
                          f"{transformers.__version__}", "use a model of an architecture this transformers knows")
    detected = kinds.detect(path, architecture, given=kind)
    if kind is not None and kind != detected:
        raise ConfigError(f"target.kind={kind} does not match the model folder {path}, which holds "
                          f"{architecture}{' with modules.json' if (path / 'modules.json').exists() else ''}: a {detected} model",
                          f"set target.kind={detected} or drop the override")
    return ModelFolder(path, detected, architecture, context_length(config))
