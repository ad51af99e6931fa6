"""`make bench` (client part): does `roi-ladder bench --endpoint` read the latencies an endpoint really has?

The endpoint client and the closed-loop load generator, as `bench --endpoint` runs them, against our reference
server (experiments/serving/reference_server.py: first token 50 ms after the request, then one per 10 ms), at
c = 1, 2, 4, 8, 16. Per level: TTFT, ITL and TPOT P50 as measured, against the known truth; the error is
measured - truth. "server" is what the reference server itself did (from the kernel's receive stamp of the
request to the start of the first token's write; on a busy machine it is sometimes late), so the client's
share, per request measured TTFT - the server's own, is what the client and loopback add: split (P50s) into
the send stamp -> the request at the server's socket ("to server") and the server's first write -> the
client's first-token stamp ("back"). Goal: |TTFT error| <= 0.5 ms at every level.

    python -m experiments.benchmarks.client_timing [--rounds 1] [--requests 48] [--tokens 16] [--callback-stamps]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.table import Table

from experiments.core.request import Prompt
from experiments.measure.load import closed_loop
from experiments.measure.resources import ResourceSampler
from experiments.serving import stamped_socket
from experiments.serving.http_client import EndpointServer
from experiments.serving.reference_server import ReferenceServer

CONCURRENCY = (1, 2, 4, 8, 16)
GOAL_TTFT_MS = 0.5


@dataclass(frozen=True)
class Timing:
    concurrency: int
    n: int
    ttft_ms: float                     # P50 as the client measured it
    itl_ms: float
    tpot_ms: float
    server_ttft_ms: float              # P50 of what the reference server actually did
    server_itl_ms: float
    client_ms: float                   # P50 per request of measured TTFT - the server's own TTFT
    to_server_ms: float                # P50: the client's send stamp -> the request at the server's socket
    back_ms: float                     # P50: the server's first write -> the client's first-token stamp

    def errors(self, truth_ttft_ms: float, truth_itl_ms: float) -> tuple[float, float, float]:
        """(TTFT, ITL, TPOT) P50 measured - truth, ms."""
        return self.ttft_ms - truth_ttft_ms, self.itl_ms - truth_itl_ms, self.tpot_ms - truth_itl_ms


def measure(ref: ReferenceServer, concurrency: int, requests: int = 48, tokens: int = 16,
            warmup: int = 4) -> Timing:
    """One closed-loop level against `ref`, as run_level drives it (warm-up apart, resources sampled)."""
    # distinct prompts, so that each of the server's stamps finds its request
    prompts = [Prompt(i, (11, 12, 13, 1000 + i), tokens) for i in range(max(requests + concurrency, warmup))]
    client = EndpointServer(ref.url, timeout_s=30)
    try:
        client.prepare(prompts)
        closed_loop(client, prompts[:warmup], concurrency, warmup, 0.0, 60.0, 30.0)
        ref.stamps(clear=True)
        with ResourceSampler():
            records = closed_loop(client, prompts, concurrency, requests, 0.0, 120.0, 30.0)
    finally:
        client.close()
    ok = [r for r in records if r.ok]
    if len(ok) < len(records):
        raise RuntimeError(f"{len(records) - len(ok)} of {len(records)} requests failed: "
                           f"{next(r.error or 'timed out' for r in records if not r.ok)}")
    metrics = [r.metrics() for r in ok]
    served = ref.stamps(clear=True)
    server = {tuple(p): (read, w) for p, read, w in served}
    client_side = {r.prompt.token_ids: r for r in ok}
    pairs = [(client_side[k], server[k]) for k in client_side.keys() & server.keys()]
    return Timing(concurrency, len(ok), _p50([m["ttft_ms"] for m in metrics]),
                  _p50([gap for r in ok for gap in r.itl_ms()]),
                  _p50([m["tpot_ms"] for m in metrics]),
                  _p50([(w[0] - read) * 1e3 for _, read, w in served]),
                  _p50(np.concatenate([np.diff(w) for _, _, w in served]) * 1e3),
                  _p50([(r.token_times[0] - r.arrival - (w[0] - read)) * 1e3 for r, (read, w) in pairs]),
                  _p50([(read - r.sent) * 1e3 for r, (read, _) in pairs]),
                  _p50([(r.token_times[0] - w[0]) * 1e3 for r, (_, w) in pairs]))


def _p50(values) -> float:
    return float(np.median(np.asarray(values, float)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--callback-stamps", action="store_true",
                        help="stamp receives in the loop's callback, not with the kernel's timestamp (as on TLS)")
    args = parser.parse_args()
    if args.callback_stamps:
        stamped_socket.SUPPORTED = False
    console = Console(width=140)
    with ReferenceServer(args.ttft_ms, args.itl_ms) as ref:
        for r in range(args.rounds):
            table = Table(title=f"endpoint client vs reference server (truth: TTFT {args.ttft_ms:g} ms, ITL = TPOT "
                                f"{args.itl_ms:g} ms; P50, ms){f'  round {r + 1}' if args.rounds > 1 else ''}")
            for col in ("c", "n", "TTFT", "server", "TTFT error", "client's share", "to server", "back", "ITL",
                        "server", "ITL error", "TPOT", "TPOT error", f"|TTFT error| <= {GOAL_TTFT_MS:g}"):
                table.add_column(col, justify="right")
            for c in CONCURRENCY:
                t = measure(ref, c, max(args.requests, 3 * c), args.tokens)
                e_ttft, e_itl, e_tpot = t.errors(args.ttft_ms, args.itl_ms)
                table.add_row(str(c), str(t.n), f"{t.ttft_ms:.2f}", f"{t.server_ttft_ms:.2f}", f"{e_ttft:+.2f}",
                              f"{t.client_ms:+.2f}", f"{t.to_server_ms:.2f}", f"{t.back_ms:.2f}", f"{t.itl_ms:.2f}",
                              f"{t.server_itl_ms:.2f}", f"{e_itl:+.2f}", f"{t.tpot_ms:.2f}",
                              f"{e_tpot:+.2f}", "yes" if abs(e_ttft) <= GOAL_TTFT_MS else "NO")
            console.print(table)
    console.print("receive stamps: " + ("the kernel's (SO_TIMESTAMPNS)" if stamped_socket.SUPPORTED
                                        else "first thing in the loop's receive callback"))


if __name__ == "__main__":
    main()
