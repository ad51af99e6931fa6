"""Reading a Hugging Face folder: its files, config and context window, and an encoder's pooling; which kind it
holds is experiments/targets/folder.py's question."""
from __future__ import annotations

import json
from pathlib import Path

from experiments.core.errors import ConfigError

# Keys a config may use for its context window, most specific first.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def context_length(config: dict) -> int | None:
    text = config.get("text_config") or config
    return next((int(text[k]) for k in CONTEXT_KEYS if isinstance(text.get(k), int)), None)


def check_pooling(path: Path) -> None:
    """The encoder engines pool by the attention-masked mean: refuse a sentence-transformers folder that pools
    otherwise, rather than serve different embeddings from the ones its authors meant."""
    modules = path / "modules.json"
    if not modules.exists():
        return
    for module in read_json(modules):
        if module.get("type", "").endswith("Pooling"):
            cfg = read_json(path / module.get("path", "") / "config.json")
            modes = [k.removeprefix("pooling_mode_") for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
            if modes != ["mean_tokens"]:
                raise ConfigError(f"model folder {path} pools by {', '.join(modes) or 'nothing'}; the encoder engines "
                                  f"pool by the mean of the tokens", "use a mean-pooling sentence-transformers model")


def check_files(path: Path) -> None:
    missing = [what for what, ok in (
        ("config.json", (path / "config.json").exists()),
        ("*.safetensors weights", any(path.glob("*.safetensors"))),
        ("tokenizer files", (path / "tokenizer.json").exists() or (path / "tokenizer.model").exists()),
    ) if not ok]
    if missing:
        raise ConfigError(f"model folder {path} lacks {', '.join(missing)}",
                          "point target.source at a Hugging Face folder saved with save_pretrained "
                          "(safetensors weights and tokenizer included)")


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", "save the model again with save_pretrained") from None
