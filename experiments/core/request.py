"""One request's life: the prompt it carries and the record a server fills in as its tokens arrive."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from experiments.core.names import Metric


@dataclass(frozen=True)
class Prompt:
    id: int
    token_ids: tuple[int, ...]
    max_new_tokens: int


class TokenList(list):
    """A request's token ids. Servers append to it directly; `listener`, when set, is called (in the server's
    thread) after each append, so an HTTP handler can stream every token as it is produced."""
    listener = None

    def append(self, token) -> None:
        super().append(token)
        if self.listener is not None:
            self.listener()


@dataclass
class RequestRecord:
    prompt: Prompt
    arrival: float = 0.0               # intended send time: latencies count from here (no coordinated omission)
    sent: float = 0.0                  # when the load generator actually handed it over
    engine_start: float | None = None
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=TokenList)
    model_s: float = 0.0
    error: str | None = None
    timed_out: bool = False
    cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def __getstate__(self) -> dict:
        """A finished record travels from a rung's child process to the sweep; its Event stays behind."""
        state = dict(self.__dict__)
        state["done"] = None
        return state

    @classmethod
    def arriving(cls, prompt: "Prompt", intended: float | None = None) -> "RequestRecord":
        """A request handed over now; its latency counts from `intended` (open loop) or from now."""
        now = time.perf_counter()
        return cls(prompt, arrival=now if intended is None else intended, sent=now)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and len(self.token_times) > 0

    def metrics(self) -> dict[str, float]:
        t = self.token_times
        m = {Metric.E2E_MS: (t[-1] - self.arrival) * 1e3, Metric.TTFT_MS: (t[0] - self.arrival) * 1e3,
             "output_tokens": len(t), "input_tokens": len(self.prompt.token_ids),
             Metric.SEND_LAG_MS: (self.sent - self.arrival) * 1e3}
        if self.engine_start is not None:   # unknown behind an external endpoint: absent, not faked
            m.update({Metric.QUEUE_MS: (self.engine_start - self.arrival) * 1e3,
                      Metric.MODEL_MS: self.model_s * 1e3})
        if len(t) > 1:
            m[Metric.TPOT_MS] = (t[-1] - t[0]) * 1e3 / (len(t) - 1)
        return m

    def itl_ms(self) -> list[float]:
        """Inter-token latencies, the one definition: the gaps between consecutive tokens (ms). A level pools
        them over its requests; a request meets an ITL SLO when each of its gaps does; their mean is the TPOT."""
        t = self.token_times
        return [(b - a) * 1e3 for a, b in zip(t, t[1:])]
