"""A GGUF file converted once into a Hugging Face folder (fp32 safetensors + tokenizer), cached by its sha256.

transformers' GGUF loader dequantizes the weights. Its tokenizer needs a check: transformers 5.5 labels the
byte-level BPE tokenizer of a `llama` GGUF (SmolLM2's) `CodeLlamaTokenizer` (eos = bos, BOS prepended), and once
saved and loaded again that class rebuilds a SentencePiece-style tokenizer that encodes every space as
`<|endoftext|>`. We build the tokenizer from the GGUF's own vocabulary with transformers' converter, wrap it as
a plain fast tokenizer with the GGUF's special tokens, and refuse the conversion unless the saved folder's
tokenizer encodes and decodes sample text back to itself.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from experiments.core.cache import build_once
from experiments.core.errors import ConfigError

CONVERT_FORMAT = 1   # bump when the conversion changes what it writes
SAMPLE_TEXTS = (
    "The capital of France is Paris.",
    "def greet(name):\n    return f\"Hello, {name}!\"  # two  spaces\n",
    "Ünïcödé, emoji 🙂, tabs\tand\nnewlines; numbers 3.14159 and 2026.",
)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(gguf_path: Path, cache_dir: Path) -> Path:
    """Where `gguf_path` is (or would be) converted."""
    import transformers  # heavy

    gguf_path = Path(gguf_path).expanduser().resolve()
    key = hashlib.sha256(json.dumps([sha256(gguf_path), transformers.__version__, CONVERT_FORMAT]).encode())
    return Path(cache_dir) / "models" / f"{gguf_path.stem}-{key.hexdigest()[:12]}"


def ensure_converted(gguf_path: Path, cache_dir: Path, progress: Callable[[str], None] = print) -> Path:
    """The cached folder converted from `gguf_path` (converting it on first use)."""
    gguf_path = Path(gguf_path).expanduser().resolve()
    out = converted_dir(gguf_path, cache_dir)
    if not build_once(out, lambda tmp: convert(gguf_path, tmp, progress), "converted GGUF model", progress):
        progress(f"converted {gguf_path.name} into {out}")
    return out


def convert(gguf_path: Path, out: Path, progress: Callable[[str], None] = print) -> None:
    import torch  # heavy
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # heavy

    architecture = check_architecture(gguf_path)
    meta = load_gguf_checkpoint(str(gguf_path))   # metadata only
    tokenizer = gguf_tokenizer(meta, meta["config"]["model_type"])
    check_round_trip(tokenizer, gguf_path.name)
    progress(f"dequantizing {gguf_path.name} ({architecture}) to fp32")
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # What the engines will load: the trap shows only after a save and reload (the class named in
    # tokenizer_config.json rebuilds the backend), so the saved folder is what must round-trip.
    check_round_trip(AutoTokenizer.from_pretrained(out), f"{gguf_path.name} (as saved)", reference=tokenizer)
    (out / "source.json").write_text(json.dumps({"gguf": gguf_path.name, "sha256": sha256(gguf_path),
                                                 "dequantized_from": "the GGUF's quantized weights"}, indent=1))


def check_architecture(gguf_path: Path) -> str:
    """The GGUF's architecture, refused unless transformers' GGUF loader knows it (its header only: cheap)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES  # heavy

    architecture = gguf_architecture(gguf_path)
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"{gguf_path.name} is a GGUF of architecture {architecture!r}, which transformers' GGUF "
                          f"loader does not know", f"use a GGUF of one of: {', '.join(GGUF_SUPPORTED_ARCHITECTURES)}")
    return architecture


def gguf_architecture(path: Path) -> str:
    from gguf import GGUFReader  # heavy

    field = GGUFReader(str(path)).fields["general.architecture"]
    return bytes(field.parts[field.data[0]]).decode()


def gguf_tokenizer(meta: dict, architecture: str):
    """A plain fast tokenizer over the GGUF's vocabulary and merges, with its special tokens and chat template;
    nothing prepended (a chat template writes its own markers)."""
    from tokenizers import processors  # heavy
    from transformers import PreTrainedTokenizerFast  # heavy
    from transformers.integrations.ggml import convert_gguf_tokenizer  # heavy

    backend, _ = convert_gguf_tokenizer(architecture, meta["tokenizer"])
    backend.post_processor = processors.ByteLevel(trim_offsets=False)   # no BOS added
    spec, tokens = meta["tokenizer"], meta["tokenizer"]["tokens"]
    named = {role: tokens[spec[f"{role}_token_id"]] for role in ("bos", "eos", "pad", "unk")
             if spec.get(f"{role}_token_id") is not None}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **{f"{r}_token": t for r, t in named.items()},
                                        add_bos_token=False, clean_up_tokenization_spaces=False)
    template = meta.get("tokenizer_config", {}).get("chat_template")
    if template:
        tokenizer.chat_template = template
    return tokenizer


def check_round_trip(tokenizer, what: str, reference=None) -> None:
    """Every sample text encodes without unknown tokens and decodes back to itself; with a reference (the
    tokenizer built from the GGUF's own vocabulary and merges), to the same token ids as it."""
    unknown = {tokenizer.unk_token_id} - {None}
    for text in SAMPLE_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        back = tokenizer.decode(ids)
        if back != text or unknown & set(ids):
            raise RuntimeError(f"the tokenizer converted from {what} does not round-trip {text!r}: it decodes to "
                               f"{back!r} via {len(ids)} tokens {ids[:12]}...; refusing to serve a model behind a "
                               f"broken tokenizer")
        if reference is not None and ids != (want := reference.encode(text, add_special_tokens=False)):
            raise RuntimeError(f"the tokenizer converted from {what} encodes {text!r} as {ids[:12]}..., not as the "
                               f"GGUF's vocabulary does ({want[:12]}...); refusing to serve a model behind a "
                               f"tokenizer the model was not trained with")
