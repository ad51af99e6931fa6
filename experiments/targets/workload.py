"""The requests a load sends: seeded prompts cut to a mix of lengths, and the metrics that apply to them.

A server with a prompt or prefix cache (llama.cpp's, vLLM's: on as deployed) reads a prompt it has seen as a hit,
so a load that re-sends its prompts measures the cache, not the engine (issue 41: llama.cpp's defaults read 146-157
tokens/s on levels that repeated the same prompts, 122 with a fresh server per level). So a synthetic workload
draws fresh prompts without end: each run of requests (a level, its warm-up, a round of the gate, the soak) reads
its own block of them, the same block for every contender, so that two engines still serve the same prompts at a
level and the gate's rounds still pair them. Only a shared prefix repeats (`shared_prefix_tokens`: the load
prefix caching is for), and a prompts file is the user's traffic: it is sent as it is, cycled.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from experiments.core.names import DEFAULT_KIND
from experiments.core.request import Prompt

BLOCK = 10**7          # prompt ids of one block: no run sends as many requests
LADDER, ROUNDS, SOAK = 0, 1000, 2000     # the first blocks of a load ladder's levels, the gate's rounds, the soak


@dataclass(frozen=True, eq=False)
class FreshPrompts:
    """Prompts drawn on demand, each from its own seeded generator: prompt (block, i) is the same in every process
    and for every contender, and no two are cut from the same draw. Their lengths go through every (input, output)
    pair once per cycle, in a shuffled order: any two runs of a dozen requests or more carry nearly the same mix
    of lengths, so runs that read different blocks (a level and the gate's rounds) still compare like with like."""
    stream: np.ndarray               # the held-out text's tokens (int32)
    prefix: tuple[int, ...]
    input_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    seed: int

    def at(self, block: int, i: int) -> Prompt:
        pairs = [(n_in, n_out) for n_in in self.input_tokens for n_out in self.output_tokens]
        cycle, k = divmod(i, len(pairs))
        n_in, n_out = pairs[random.Random(f"{self.seed}/{block}/cycle {cycle}").sample(range(len(pairs)),
                                                                                       len(pairs))[k]]
        start = random.Random(f"{self.seed}/{block}/{i}").randrange(0, len(self.stream) - n_in)
        return Prompt(block * BLOCK + i, self.prefix + tuple(int(t) for t in self.stream[start:start + n_in]), n_out)


@dataclass(frozen=True)
class Requests:
    """What one run sends, in order: requests[i] is its i-th request (a run takes as many as it needs)."""
    workload: "Workload"
    block: int
    warmup: bool = False
    start: int = 0                   # requests[0] is the block's request `start`

    def __getitem__(self, i: int) -> Prompt:
        wl, i = self.workload, self.start + i
        if wl.fresh is not None:
            return wl.fresh.at(-1 - self.block if self.warmup else self.block, i)
        cycled = wl.warmup if self.warmup else wl.prompts
        return cycled[i % len(cycled)]

    def after(self, sent: int) -> "Requests":
        """The same run's requests from the one after the first `sent` (a soak's next window)."""
        return Requests(self.workload, self.block, self.warmup, self.start + sent)


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]      # the first measured ones, in a fixed seeded order (a file's: all of them)
    warmup: tuple[Prompt, ...]       # distinct from the measured ones
    kind: str = DEFAULT_KIND           # the target's kind: which latencies apply, what its throughput is
    fresh: FreshPrompts | None = None  # None: `prompts` and `warmup` are all there is, and runs cycle them

    def requests(self, block: int, warmup: bool = False) -> Requests:
        """The requests of run `block` (its warm-up's with `warmup`): fresh ones, never sent by another block,
        where the workload draws them; else its prompts, cycled from the first."""
        return Requests(self, block, warmup)

    @property
    def repeats(self) -> str | None:
        """How this workload repeats what it sends to a server, or None where it never does."""
        if self.fresh is None:
            return "its prompts are sent as given, cycled"
        return f"every prompt starts with the same {len(self.fresh.prefix)} tokens" if self.fresh.prefix else None

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
        """Windows of held-out text cut to a mix of input lengths, each with a mix of output lengths, drawn
        fresh for every run (FreshPrompts); `prompts` holds the first `count` of the first block.

        shared_prefix_tokens > 0 puts the same leading tokens (a "system prompt") before every prompt, input
        lengths counting after it: the load that shows what prefix caching saves."""
        rng = random.Random(seed)
        stream = np.array([t for text in texts for t in tokenizer.encode(text, add_special_tokens=False)],
                          dtype=np.int32)
        longest = max(input_tokens) + shared_prefix_tokens
        if not input_tokens or not output_tokens or count < 1:
            raise ValueError("a workload needs input and output lengths and at least one prompt")
        if len(stream) <= longest + 1:
            raise ValueError(f"workload text has {len(stream)} tokens; need more than {longest + 1}")
        start = rng.randrange(0, len(stream) - shared_prefix_tokens) if shared_prefix_tokens else 0
        prefix = tuple(int(t) for t in stream[start:start + shared_prefix_tokens])
        fresh = FreshPrompts(stream, prefix, tuple(input_tokens), tuple(output_tokens), seed)
        return cls(prompts=tuple(fresh.at(LADDER, i) for i in range(count)),
                   warmup=tuple(fresh.at(-1 - LADDER, i) for i in range(warmup_count)), fresh=fresh)
