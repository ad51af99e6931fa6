"""The requests a load sends: fixed, seeded prompts cut to a mix of lengths, and the metrics that apply to them."""
from __future__ import annotations

import random
from dataclasses import dataclass

from experiments.core.names import DEFAULT_KIND
from experiments.core.request import Prompt


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]      # measured, in a fixed seeded order
    warmup: tuple[Prompt, ...]       # distinct from the measured ones
    kind: str = DEFAULT_KIND           # the target's kind: which latencies apply, what its throughput is


    @classmethod
    def from_sentences(cls, texts: list[str], tokenizer, count: int, warmup_count: int, seed: int,
                       max_tokens: int, kind: str) -> "Workload":
        """Texts to embed (queries and passages: a mix of lengths), tokenized with their special tokens and
        truncated to max_tokens, in a seeded order; one output each (the embedding)."""
        if count < 1 or len(texts) < 2:
            raise ValueError("an embedding workload needs at least one prompt and two texts")
        rng = random.Random(seed)
        picked = [texts[rng.randrange(len(texts))] for _ in range(count + warmup_count)]
        prompts = [Prompt(i, tuple(tokenizer(text, truncation=True, max_length=max_tokens)["input_ids"]), 1)
                   for i, text in enumerate(picked)]
        return cls(prompts=tuple(prompts[:count]), warmup=tuple(prompts[count:]), kind=kind)

    @classmethod
    def from_texts(cls, texts: list[str], tokenizer, input_tokens, output_tokens, count: int,
                   warmup_count: int, seed: int, shared_prefix_tokens: int = 0) -> "Workload":
        """Windows of held-out text cut to a mix of input lengths, each with a mix of output lengths.

        shared_prefix_tokens > 0 puts the same leading tokens (a "system prompt") before every prompt, input
        lengths counting after it: the load that shows what prefix caching saves."""
        rng = random.Random(seed)
        stream = [t for text in texts for t in tokenizer.encode(text, add_special_tokens=False)]
        longest = max(input_tokens) + shared_prefix_tokens
        if not input_tokens or not output_tokens or count < 1:
            raise ValueError("a workload needs input and output lengths and at least one prompt")
        if len(stream) <= longest + 1:
            raise ValueError(f"workload text has {len(stream)} tokens; need more than {longest + 1}")
        start = rng.randrange(0, len(stream) - shared_prefix_tokens) if shared_prefix_tokens else 0
        prefix = tuple(stream[start:start + shared_prefix_tokens])
        prompts = []
        for i in range(count + warmup_count):
            n_in = rng.choice(list(input_tokens))
            start = rng.randrange(0, len(stream) - n_in)
            prompts.append(Prompt(i, prefix + tuple(stream[start:start + n_in]), rng.choice(list(output_tokens))))
        return cls(prompts=tuple(prompts[:count]), warmup=tuple(prompts[count:]))
