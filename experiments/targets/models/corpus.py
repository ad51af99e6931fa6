"""Text every machine has: the Python standard library's own sources, split by file into train and held-out."""
from __future__ import annotations

import hashlib
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

from experiments.core.errors import ConfigError

# The stdlib's held-out files, as tiny-llm's build splits them: text no model here trained on.
DEFAULT_HELDOUT_EVERY = 8


@dataclass(frozen=True)
class Corpus:
    train: list[str]
    heldout: list[str]
    fingerprint: str

    @classmethod
    def from_stdlib(cls, heldout_every: int) -> "Corpus":
        """Top-level stdlib modules, sorted; a file goes to held-out when crc32(name) % heldout_every == 0."""
        root = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(root.glob("*.py"))
        if not files:
            raise RuntimeError(f"no Python sources found under {root}: cannot build the built-in model here")
        train, heldout, digest = [], [], hashlib.sha256()
        for f in files:
            text = f.read_text(encoding="utf-8", errors="replace")
            digest.update(f.name.encode())
            digest.update(hashlib.sha256(text.encode()).digest())
            (heldout if zlib.crc32(f.name.encode()) % heldout_every == 0 else train).append(text)
        return cls(train=train, heldout=heldout, fingerprint=digest.hexdigest()[:16])


def code_lines(text: str, min_chars: int = 1) -> list[str]:
    """Non-blank lines with trailing whitespace removed (indentation kept: it is what a code model learns first)."""
    return [ln.rstrip() for ln in text.splitlines() if len(ln.strip()) >= min_chars]


def check_corpus(path) -> Path:
    """Before any work: the corpus is there (its texts are read once the model is)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ConfigError(f"target.workload.corpus {path} does not exist", "pass a text file or a folder of them")
    return path


def texts_from(path) -> list[str]:
    """The text of a file, or of every file under a folder (sorted; files that are not UTF-8 text skipped)."""
    path = check_corpus(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    texts = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            texts.append(text)
    if not texts:
        raise ConfigError(f"target.workload.corpus {path} holds no UTF-8 text", "pass a text file or a folder of them")
    return texts


def corpus_texts(corpus) -> list[str]:
    """target.workload.corpus's texts; null: the standard library's held-out files."""
    return texts_from(corpus) if corpus else Corpus.from_stdlib(DEFAULT_HELDOUT_EVERY).heldout
