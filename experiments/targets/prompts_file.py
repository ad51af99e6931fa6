"""The user's own traffic: a JSONL file, one request per line, read and checked before any long work.

A line is `{"prompt": "..."}` (tokenized as a completions endpoint does, special tokens included) or
`{"messages": [{"role": ..., "content": ...}, ...]}` (rendered with the tokenizer's chat template, generation
prompt added), with an optional `"max_tokens"`: that request's output length. Without it the length is drawn
from `target.workload.output_tokens`. Lines of query/passage pairs belong to an embedding model.
"""
from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.core.errors import ConfigError
from experiments.core.request import Prompt
from experiments.targets.workload import Workload

FORMAT = 'one JSON object per line: {"prompt": "..."} or {"messages": [...]}, optionally with "max_tokens": N'


@dataclass(frozen=True)
class Request:
    line: int                       # 1-based line number in the file, for messages
    text: str                       # the prompt as the model sees it (chat rendered)
    token_ids: tuple[int, ...]
    max_tokens: int


def check_file(path: Path) -> None:
    """Before anything is built: the file is there and not empty (its lines are a causal LM's: check_lines)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"target.workload.prompts file {path} does not exist", f"pass a JSONL file: {FORMAT}")
    if not path.read_text(encoding="utf-8", errors="replace").strip():
        raise ConfigError(f"target.workload.prompts file {path} is empty", f"write {FORMAT}")


def check_lines(path: Path) -> None:
    """Before anything is built: every line is a well-formed request (their token counts and a chat template
    need the model's tokenizer, checked by read())."""
    for _ in _lines(path):   # each line parsed; _lines checks the file is there and not empty
        pass


def read(path: Path, tokenizer, output_tokens: Sequence[int], context_length: int | None, seed: int) -> list[Request]:
    """Every request in the file, tokenized; an output length drawn (seeded) for lines without max_tokens."""
    path = Path(path).expanduser()
    rng = random.Random(seed)
    requests = [_request(f"{path} line {number}", number, line, tokenizer, output_tokens, rng)
                for number, line in _lines(path)]
    if not requests:
        raise ConfigError(f"target.workload.prompts file {path} is empty", f"write {FORMAT}")
    if context_length is not None:
        check_context(path, requests, context_length)
    return requests


def check_context(path: Path, requests: list[Request], context_length: int) -> None:
    for r in requests:
        if len(r.token_ids) + r.max_tokens > context_length:
            raise ConfigError(f"{path} line {r.line}: {len(r.token_ids)} prompt tokens + {r.max_tokens} output tokens "
                              f"exceed the model's context window of {context_length} tokens",
                              "shorten that prompt or its max_tokens")


def _lines(path: Path):
    """(line number, request object) for each non-blank line, each checked without a tokenizer."""
    path = Path(path).expanduser()
    check_file(path)
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, raw in enumerate(fh, start=1):
            if raw.strip():
                yield number, _parsed(f"{path} line {number}", raw)


def _parsed(where: str, raw: str) -> dict:
    try:
        line = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not valid JSON ({exc.msg})", f"write {FORMAT}") from None
    if not isinstance(line, dict):
        raise ConfigError(f"{where} is a JSON {type(line).__name__}, not an object", f"write {FORMAT}")
    if "query" in line or "passage" in line:
        raise ConfigError(f"{where} is a query/passage pair, which scores an embedding model, not a causal LM",
                          f"for a causal LM write {FORMAT}")
    if ("prompt" in line) == ("messages" in line):
        raise ConfigError(f"{where} has {'both' if 'prompt' in line else 'neither'} \"prompt\" and \"messages\"",
                          f"write {FORMAT}")
    if "prompt" in line and not isinstance(line["prompt"], str):
        raise ConfigError(f"{where}: \"prompt\" is not a string", f"write {FORMAT}")
    messages = line.get("messages")
    if "messages" in line and not (isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)):
        raise ConfigError(f"{where}: \"messages\" is not a list of {{\"role\": ..., \"content\": ...}} strings",
                          f"write {FORMAT}")
    max_tokens = line.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ConfigError(f"{where}: max_tokens {max_tokens!r} is not an integer >= 1", "give a whole number of tokens")
    return line


def _request(where: str, number: int, line: dict, tokenizer, output_tokens, rng: random.Random) -> Request:
    text = _prompt_text(where, line, tokenizer)
    ids = tuple(tokenizer(text, add_special_tokens="prompt" in line)["input_ids"])
    if not ids:
        raise ConfigError(f"{where}: the prompt is empty", "give every request some text")
    max_tokens = line.get("max_tokens")
    if max_tokens is None:
        max_tokens = rng.choice(list(output_tokens))
    return Request(number, text, ids, int(max_tokens))


def _prompt_text(where: str, line: dict, tokenizer) -> str:
    if "prompt" in line:
        return line["prompt"]
    if not tokenizer.chat_template:
        raise ConfigError(f"{where} holds chat messages, but the model's tokenizer has no chat template",
                          "write plain {\"prompt\": \"...\"} lines for this model, or use a model with a chat template")
    # The template writes the special tokens itself (BOS included where the model wants one).
    return tokenizer.apply_chat_template(line["messages"], add_generation_prompt=True, tokenize=False)


def workload(requests: list[Request], warmup_count: int, seed: int):
    """Every request measured, in file order (the load cycles through them); the warm-up draws from the same
    file, seeded: the user's traffic has no other prompts to warm up with."""
    prompts = tuple(Prompt(i, r.token_ids, r.max_tokens) for i, r in enumerate(requests))
    rng = random.Random(seed)
    warmup = tuple(Prompt(len(prompts) + i, r.token_ids, r.max_tokens)
                   for i, r in enumerate(rng.choices(requests, k=warmup_count)))
    return Workload(prompts=prompts, warmup=warmup)
