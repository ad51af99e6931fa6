"""A user's own Hugging Face folder (saved with `save_pretrained`) as a target: what it is, checked before any work.

The kind comes from the folder (experiments/kinds: each kind says what its folders hold): a `*ForCausalLM`
architecture is a causal LM; a sentence-transformers folder (`modules.json`) or a bare encoder (`*Model`) is an
embedding model. Only architectures that the installed transformers ships are served: a folder whose config
maps to its own code (`auto_map`) would need `trust_remote_code`, which ROI Ladder never sets.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from experiments.errors import ConfigError

# Keys a config may use for its context window, most specific first.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    kind: str                 # a target kind's name (experiments/kinds): causal-lm | embedding
    architecture: str
    context_length: int | None

    @property
    def default_name(self) -> str:
        return self.path.name


def inspect(path: Path, kind: str | None = None) -> ModelFolder:
    """The folder's kind (detected; `kind`, when given, must agree), architecture and context window."""
    path = Path(path).expanduser().resolve()
    _check_files(path)
    config = _read_json(path / "config.json")
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
    import transformers

    if not hasattr(transformers, architecture):
        raise ConfigError(f"model folder {path}: architecture {architecture!r} is not shipped by transformers "
                          f"{transformers.__version__}", "use a model of an architecture this transformers knows")
    detected = detect_kind(path, architecture, given=kind)
    if kind is not None and kind != detected:
        raise ConfigError(f"target.kind={kind} does not match the model folder {path}, which holds "
                          f"{architecture}{' with modules.json' if (path / 'modules.json').exists() else ''}: a {detected} model",
                          f"set target.kind={detected} or drop the override")
    return ModelFolder(path, detected, architecture, context_length(config))


def detect_kind(path: Path, architecture: str, given: str | None = None) -> str:
    """The kind whose folders look like this one (experiments/kinds: each kind says what its folders hold); the
    given kind where none claims it (the user knows, e.g. an encoder saved as BertForMaskedLM)."""
    from experiments import kinds

    found = kinds.detect(path, architecture) or given
    if found is None:
        served = " and ".join(kinds.kind_of(name).folders for name in kinds.names())
        raise ConfigError(f"model folder {path}: cannot tell its kind from architecture {architecture!r}",
                          f"ROI Ladder serves {served}; set target.kind if this one is either")
    return found


def context_length(config: dict) -> int | None:
    text = config.get("text_config") or config
    return next((int(text[k]) for k in CONTEXT_KEYS if isinstance(text.get(k), int)), None)


def check_pooling(path: Path) -> None:
    """The encoder engines pool by the attention-masked mean: refuse a sentence-transformers folder that pools
    otherwise, rather than serve different embeddings from the ones its authors meant."""
    modules = path / "modules.json"
    if not modules.exists():
        return
    for module in _read_json(modules):
        if module.get("type", "").endswith("Pooling"):
            cfg = _read_json(path / module.get("path", "") / "config.json")
            modes = [k.removeprefix("pooling_mode_") for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
            if modes != ["mean_tokens"]:
                raise ConfigError(f"model folder {path} pools by {', '.join(modes) or 'nothing'}; the encoder engines "
                                  f"pool by the mean of the tokens", "use a mean-pooling sentence-transformers model")


def _check_files(path: Path) -> None:
    missing = [what for what, ok in (
        ("config.json", (path / "config.json").exists()),
        ("*.safetensors weights", any(path.glob("*.safetensors"))),
        ("tokenizer files", (path / "tokenizer.json").exists() or (path / "tokenizer.model").exists()),
    ) if not ok]
    if missing:
        raise ConfigError(f"model folder {path} lacks {', '.join(missing)}",
                          "point target.source at a Hugging Face folder saved with save_pretrained "
                          "(safetensors weights and tokenizer included)")


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", "save the model again with save_pretrained") from None
