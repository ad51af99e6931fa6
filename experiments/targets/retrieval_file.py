"""An embedding model's own texts: a JSONL file (`target.workload.prompts`), read and checked before any work.

A line is a query/passage pair, `{"query": "...", "passage": "..."}`: the pairs become the retrieval eval
(recall@k of each query's own passage among all the file's passages). Or a plain text, `{"text": "..."}` (or
`{"prompt": "..."}`): embedded by the workload and in the cosine check only. Every text of the file, queries and
passages included, is what the workload embeds and what the cosine to the baseline is measured on.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from experiments.core.errors import ConfigError
from experiments.targets.models.minilm import RetrievalSet

FORMAT = 'one JSON object per line: {"query": "...", "passage": "..."} or {"text": "..."}'


@dataclass(frozen=True)
class EmbeddingTexts:
    retrieval: RetrievalSet | None   # the file's pairs; None when it has none (cosine only)
    extra: tuple[str, ...]           # the plain texts

    def texts(self) -> list[str]:
        """Queries, distinct passages, then the plain texts: what is embedded, each once."""
        return [*(self.retrieval.texts() if self.retrieval else []), *self.extra]


def read(path: Path) -> EmbeddingTexts:
    """The file's pairs and texts. A passage given for several queries is one passage answering each of them."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"target.workload.prompts file {path} does not exist", f"pass a JSONL file: {FORMAT}")
    queries, relevant, passages, extra = [], [], {}, []
    with path.open(encoding="utf-8") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            line = _line(f"{path} line {number}", raw)
            if "query" in line:
                queries.append(line["query"])
                relevant.append(passages.setdefault(line["passage"], len(passages)))
            else:
                extra.append(line["text"] if "text" in line else line["prompt"])
    if not queries and not extra:
        raise ConfigError(f"target.workload.prompts file {path} is empty", f"write {FORMAT}")
    if queries and len(passages) < 2:
        raise ConfigError(f"{path} has query/passage pairs with only one distinct passage: every query would find "
                          f"it first", "give at least two pairs with different passages")
    if len(queries) + len(passages) + len(extra) < 2:
        raise ConfigError(f"{path} holds a single text; the workload needs at least two", f"write {FORMAT}")
    retrieval = RetrievalSet(tuple(queries), tuple(passages), tuple(relevant)) if queries else None
    return EmbeddingTexts(retrieval, tuple(extra))


def _line(where: str, raw: str) -> dict:
    try:
        line = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not valid JSON ({exc.msg})", f"write {FORMAT}") from None
    if not isinstance(line, dict):
        raise ConfigError(f"{where} is a JSON {type(line).__name__}, not an object", f"write {FORMAT}")
    if "messages" in line:
        raise ConfigError(f"{where} holds chat messages, which an embedding model does not take", f"write {FORMAT}")
    if ("query" in line) != ("passage" in line):
        raise ConfigError(f"{where} has a \"{'query' if 'query' in line else 'passage'}\" without its "
                          f"\"{'passage' if 'query' in line else 'query'}\"", f"write {FORMAT}")
    keys = [k for k in ("query", "text", "prompt") if k in line]
    if len(keys) != 1:
        raise ConfigError(f"{where} has {'none' if not keys else ' and '.join(keys)} of \"query\"/\"passage\", "
                          f"\"text\", \"prompt\"", f"write exactly one per line: {FORMAT}")
    for key in ("query", "passage") if keys == ["query"] else keys:
        if not isinstance(line[key], str) or not line[key].strip():
            raise ConfigError(f"{where}: \"{key}\" is not a non-empty string", f"write {FORMAT}")
    return line


def check_recall_at(path, own: EmbeddingTexts, recall_at: list[int]) -> None:
    """Every k of recall@k within the file's distinct passages (with no pairs there is no recall to score)."""
    if own.retrieval and max(int(k) for k in recall_at) > len(own.retrieval.passages):
        n = len(own.retrieval.passages)
        raise ConfigError(f"target.scoring.recall_at {list(recall_at)} asks for the top {max(recall_at)} of the {n} "
                          f"distinct passages in {path}", f"keep every k <= {n}, or add query/passage pairs")
