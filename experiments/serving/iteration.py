"""Our own iteration-level (continuous) scheduler over the torch engine's model, with a left-padded batched KV cache.

One worker thread loops over steps. Each step: take what arrived; admit waiting requests while the batch has
room (`max_batch` running sequences) and the step's token budget (`max_tokens_per_step`: one decode token per
running sequence plus the newcomers' prefill, counted padded) allows; prefill the newcomers together (left
padding) and join their KV rows to the running cache; then one batched decode forward for every running
sequence. A sequence that has its tokens leaves at once: its rows are dropped and columns that only padding
still fills are cut off. The cache is re-padded only when membership changes; a plain step only appends.

Padding never changes a token: padded key positions are masked out (attention_mask 0), every row carries its
own position ids, so each sequence sees what it would see alone. Greedy, exactly max_new_tokens tokens (EOS
ignored), as the other engines. Each token is stamped when its step returns; a request's model time is the
compute of the steps it took part in (its prefill, the decode steps, and the re-padding its arrival or the
departures in its steps caused). A failed forward fails the requests in that step, not the thread.
"""
from __future__ import annotations

import queue
import time
from collections import deque
from dataclasses import dataclass

import torch

from experiments.core.request import RequestRecord
from experiments.serving.continuous import KvUsage
from experiments.serving.queue_server import QueueServer


@dataclass
class _Row:
    """A running sequence: its request, the token it feeds next and that token's position."""
    rec: RequestRecord
    next_token: int
    position: int

    @property
    def finished(self) -> bool:
        return len(self.rec.tokens) >= self.rec.prompt.max_new_tokens or self.rec.cancelled


class IterationServer(QueueServer):
    thread_name = "roi-iteration-server"

    def __init__(self, engine, max_batch: int, max_tokens_per_step: int):
        if max_batch < 1 or max_tokens_per_step < 1:
            raise ValueError(f"the own continuous scheduler needs max_batch >= 1 and max_tokens_per_step >= 1 "
                             f"(got {max_batch}, {max_tokens_per_step})")
        super().__init__()
        self.model = engine.model
        self.device = getattr(engine, "device", torch.device("cpu"))
        self.max_batch, self.max_tokens_per_step = max_batch, max_tokens_per_step
        config = self.model.config
        self._pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self._kv_bytes_per_token = (2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
                                    * self.model.dtype.itemsize)
        self._waiting: deque[RequestRecord] = deque()
        self._rows: list[_Row] = []       # running sequences, in the order of the cache's batch rows
        self._cache = None                # DynamicCache, [rows, heads, length, dim] per layer
        self._mask = None                 # [rows, length] long: 1 = a real token, 0 = left padding
        self._stopping = False
        self.running = 0                  # running sequences, readable from other threads
        self.kv_slots = 0                 # token slots the cache holds (padding included)
        self._start()

    def kv_usage(self) -> KvUsage:
        """KV memory the batched cache holds, padding included; one "block" is one token slot of one row."""
        return KvUsage(self.kv_slots, self.kv_slots, self._kv_bytes_per_token)

    def close(self) -> None:
        """Serves what was submitted before close, then stops; whatever is left after a minute fails."""
        super().close()
        for rec in list(self._waiting) + [row.rec for row in self._rows]:
            if not rec.done.is_set():
                rec.error = "server closed"
                rec.done.set()

    # --- the loop -----------------------------------------------------------------------------------------
    def _serve(self) -> None:
        with torch.inference_mode():
            while True:
                self._take(block=not self._rows and not self._waiting)
                if self._stopping and not self._rows and not self._waiting:
                    return
                newcomers: list[RequestRecord] = []
                try:
                    newcomers = self._admit()
                    if newcomers:
                        self._prefill(newcomers)
                    if self._rows:
                        self._decode()
                except Exception as exc:  # outside a forward (re-padding, say): the batch fails, the loop goes on
                    self._fail(newcomers + [row.rec for row in self._rows], exc)
                    self._reset()

    def _take(self, block: bool) -> None:
        try:
            item = self._queue.get() if block else self._queue.get_nowait()
            while True:
                if item is None:
                    self._stopping = True
                else:
                    self._waiting.append(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            pass

    def _admit(self) -> list[RequestRecord]:
        """FIFO while the batch has room and the padded prefill fits the step's token budget beside the decode
        tokens; the head of the queue is always admitted into an empty batch, so no prompt waits forever."""
        budget = self.max_tokens_per_step - len(self._rows)
        chosen: list[RequestRecord] = []
        width = 0
        while self._waiting and len(self._rows) + len(chosen) < self.max_batch:
            rec = self._waiting[0]
            n = len(rec.prompt.token_ids)
            if rec.cancelled or n == 0 or rec.prompt.max_new_tokens < 1:
                self._waiting.popleft()
                if n == 0 and not rec.cancelled:
                    rec.error = "empty prompt"
                rec.done.set()
                continue
            if max(width, n) * (len(chosen) + 1) > budget and (chosen or self._rows):
                break
            width = max(width, n)
            chosen.append(self._waiting.popleft())
        return chosen

    def _prefill(self, recs: list[RequestRecord]) -> None:
        from transformers import DynamicCache  # heavy

        width = max(len(r.prompt.token_ids) for r in recs)
        ids = torch.full((len(recs), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(recs), width), dtype=torch.long)
        for i, rec in enumerate(recs):
            n = len(rec.prompt.token_ids)
            ids[i, width - n:] = torch.tensor(rec.prompt.token_ids, dtype=torch.long)
            mask[i, width - n:] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        started = time.perf_counter()
        for rec in recs:
            rec.engine_start = started
        try:
            cache = DynamicCache(config=self.model.config)
            ids, mask, positions = (t.to(self.device) for t in (ids, mask, positions))
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                                use_cache=True, logits_to_keep=1).logits
            tokens = logits[:, -1].argmax(-1).tolist()    # syncs the device: the compute time is real
        except Exception as exc:  # a failed step fails its requests, counted as errors
            self._fail(recs, exc)
            return
        now = time.perf_counter()
        rows = []
        for rec, token in zip(recs, tokens):
            rec.token_times.append(now)
            rec.tokens.append(int(token))
            rows.append(_Row(rec, int(token), len(rec.prompt.token_ids)))
        keep = [i for i, row in enumerate(rows) if not row.finished]
        if keep:
            self._join(cache, mask, [rows[i] for i in keep], keep)
        self.kv_slots = 0 if self._mask is None else self._mask.numel()
        _charge(rows, now - started, time.perf_counter() - now)
        for row in rows:
            if row.finished:
                row.rec.done.set()

    def _join(self, cache, mask: torch.Tensor, rows: list[_Row], keep: list[int]) -> None:
        """The newcomers' KV rows join the running cache, both left-padded to the longer of the two."""
        index = torch.tensor(keep, device=mask.device)
        new_kv = [(layer.keys.index_select(0, index), layer.values.index_select(0, index)) for layer in cache.layers]
        new_kv, new_mask = _trim(new_kv, mask.index_select(0, index))
        if self._rows:
            length = max(self._mask.shape[1], new_mask.shape[1])
            old_kv, old_mask = _left_pad(self._kv(), self._mask, length)
            new_kv, new_mask = _left_pad(new_kv, new_mask, length)
            new_kv = [(torch.cat([ok, nk]), torch.cat([ov, nv])) for (ok, ov), (nk, nv) in zip(old_kv, new_kv)]
            new_mask = torch.cat([old_mask, new_mask])
        self._set_cache(new_kv, new_mask)
        self._rows.extend(rows)
        self.running = len(self._rows)

    def _decode(self) -> None:
        rows = self._rows
        started = time.perf_counter()
        try:
            ids = torch.tensor([[row.next_token] for row in rows], dtype=torch.long, device=self.device)
            positions = torch.tensor([[row.position] for row in rows], dtype=torch.long, device=self.device)
            mask = torch.cat([self._mask, self._mask.new_ones((len(rows), 1))], dim=1)
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                past_key_values=self._cache, use_cache=True).logits
            tokens = logits[:, -1].argmax(-1).tolist()
        except Exception as exc:  # the cache may be half-updated: the whole step fails, the batch restarts empty
            self._fail([row.rec for row in rows], exc)
            self._reset()
            return
        now = time.perf_counter()
        self._mask = mask
        for row, token in zip(rows, tokens):
            row.rec.token_times.append(now)
            row.rec.tokens.append(int(token))
            row.next_token, row.position = int(token), row.position + 1
        leaving = [row for row in rows if row.finished]
        if leaving:
            self._leave([i for i, row in enumerate(rows) if not row.finished])
        self.kv_slots = 0 if self._mask is None else self._mask.numel()
        _charge(rows, now - started, time.perf_counter() - now)
        for row in leaving:
            row.rec.done.set()

    def _leave(self, keep: list[int]) -> None:
        """Finished sequences leave at once: their rows go, and so do columns that only padding fills now."""
        self._rows = [self._rows[i] for i in keep]
        self.running = len(self._rows)
        if not keep:
            self._cache, self._mask = None, None
            return
        index = torch.tensor(keep, device=self._mask.device)
        kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self._kv()]
        self._set_cache(*_trim(kv, self._mask.index_select(0, index)))

    # --- cache plumbing -------------------------------------------------------------------------------------
    def _kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self._cache.layers]

    def _set_cache(self, kv, mask: torch.Tensor) -> None:
        from transformers import DynamicCache  # heavy

        self._cache = DynamicCache(kv, config=self.model.config)
        self._mask = mask

    def _reset(self) -> None:
        self._rows, self._cache, self._mask, self.running, self.kv_slots = [], None, None, 0, 0

    def _fail(self, recs: list[RequestRecord], exc: Exception) -> None:
        for rec in recs:
            if rec.done.is_set():
                continue
            rec.error = f"{type(exc).__name__}: {exc}"
            rec.done.set()


def _charge(rows, forward_s: float, plumbing_s: float) -> None:
    """Model time of a step: its forward for every row; the cache re-padding after it only for the rows that
    stay (a row that finished already has its last token, stamped before the re-padding)."""
    for row in rows:
        row.rec.model_s += forward_s + (0.0 if row.finished else plumbing_s)


def _trim(kv, mask: torch.Tensor):
    """Cut the leading columns that are padding in every row."""
    start = int(mask.any(0).int().argmax())
    if start == 0:
        return kv, mask
    return [(k[:, :, start:], v[:, :, start:]) for k, v in kv], mask[:, start:]


def _left_pad(kv, mask: torch.Tensor, length: int):
    extra = length - mask.shape[1]
    if extra == 0:
        return kv, mask
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, extra, 0))  # noqa: E731  (dim -2: the sequence)
    return [(pad(k), pad(v)) for k, v in kv], torch.nn.functional.pad(mask, (extra, 0))
