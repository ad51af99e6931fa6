"""A reference OpenAI-compatible streaming endpoint with known timing, to measure the client against.

Every completion streams its first token `ttft_ms` after the request reached the server's socket (the kernel's
receive timestamp, where there is one), then one token every `itl_ms`, on a fixed schedule from that instant
(a late write does not delay the next). It runs in a process of its own
(`ReferenceServer`), so the client being measured shares no interpreter lock with it, and one thread per
connection sleeps to each deadline (clock_nanosleep: tens of microseconds, not the event loop's millisecond
timers). It also records when each request line came in and each token's write began (perf_counter, the same
CLOCK_MONOTONIC as the client's on Linux): GET /stamps returns them, so what remains is the client's error.

    python -m experiments.serving.reference_server [--ttft-ms 50] [--itl-ms 10] [--port 0]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.request import urlopen

MODEL = "reference"
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)   # Linux's value; Python does not export it
SPIN_S = 0.001


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"        # keep-alive, as a real endpoint: no connection set-up per request
    ttft_s, itl_s = 0.050, 0.010
    stamps: list[tuple] = []             # (prompt, request line in, each token's write begun), per request
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        # Without it Nagle holds each small token chunk until the client's delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)

    def handle_one_request(self):
        self.arrived = _kernel_arrival(self.connection)
        super().handle_one_request()

    def parse_request(self):
        # Without the kernel's stamp: as soon as the request line is in, not after the headers' parsing.
        if self.arrived is None:
            self.arrived = time.perf_counter()
        return super().parse_request()

    def do_GET(self):
        if self.path.startswith("/stamps"):
            with self.lock:
                body = json.dumps(self.stamps).encode()
                if "clear" in self.path:
                    self.stamps.clear()
        else:
            body = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
        self._whole(200, body)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        read = self.arrived
        try:
            request = json.loads(raw)
            n, prompt = int(request.get("max_tokens", 16)), request.get("prompt")
        except (ValueError, TypeError, AttributeError):
            return self._whole(400, b'{"error":{"message":"not a JSON object"}}')
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = {"id": "cmpl-ref", "object": "text_completion", "model": MODEL}
        events = [_chunked("data: " + json.dumps({**chunk, "choices": [
            {"index": 0, "text": "a", "finish_reason": "length" if k == n - 1 else None}]}) + "\n\n")
            for k in range(n)]           # built before the first deadline: none of it on the timed path
        written = []
        for k, event in enumerate(events):
            deadline = read + self.ttft_s + k * self.itl_s
            # A sleep wakes up to ~0.5 ms late on a busy machine; the first token is the one TTFT is judged by,
            # so it sleeps short and spins the last millisecond (later tokens keep the schedule on average).
            time.sleep(max(0.0, deadline - time.perf_counter() - (SPIN_S if k == 0 else 0.0)))
            while time.perf_counter() < deadline:
                pass                         # the short switch interval lets other connections' threads in
            written.append(time.perf_counter())   # before the send: it may hand the CPU to the reader first
            self.wfile.write(event)
        self.wfile.write(_chunked("data: [DONE]\n\n") + b"0\r\n\r\n")
        with self.lock:
            self.stamps.append((prompt, read, written))

    def _whole(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256             # a whole load level may connect at once


def _kernel_arrival(sock: socket.socket) -> float | None:
    """When the kernel received the next request's first bytes, on perf_counter's clock; None where the socket
    gives no receive timestamp. The schedule counts from there, so that however late this thread wakes (the
    lock, a busy CPU) is not charged to the client. Peeks: it assumes clients that do not pipeline requests."""
    try:
        data, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(16), socket.MSG_PEEK)
    except OSError:
        return None
    offset_ns = time.time_ns() - time.perf_counter_ns()
    for level, kind, raw in ancillary:
        if data and level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
            sec, nsec = struct.unpack("qq", raw[:16])
            return (sec * 10**9 + nsec - offset_ns) / 1e9
    return None


def _chunked(text: str) -> bytes:
    data = text.encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


class ReferenceServer:
    """The reference endpoint in a child process: `url`, `stamps()`, and close() (or a `with` block)."""

    def __init__(self, ttft_ms: float = 50.0, itl_ms: float = 10.0, start_timeout_s: float = 30.0):
        self.ttft_ms, self.itl_ms = ttft_ms, itl_ms
        root = Path(__file__).resolve().parents[2]
        self._proc = subprocess.Popen([sys.executable, __file__, "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)],
                                      stdout=subprocess.PIPE, text=True, cwd=root)
        line = _first_line(self._proc, start_timeout_s)
        if not line.startswith("http://"):
            self.close()
            raise RuntimeError(f"the reference server did not start (it said {line!r})")
        self.url = line.strip()

    def stamps(self, clear: bool = True) -> list[tuple]:
        """(prompt, request line in, token writes begun) per request finished since the last clear."""
        with urlopen(f"{self.url}/stamps{'?clear=1' if clear else ''}", timeout=10) as resp:
            return json.loads(resp.read())

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()

    def __enter__(self) -> "ReferenceServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return got[0] if got else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    _Handler.ttft_s, _Handler.itl_s = args.ttft_ms / 1e3, args.itl_ms / 1e3
    # A thread whose deadline came must not wait the default 5 ms for the interpreter lock.
    sys.setswitchinterval(5e-5)
    server = _Server((args.host, args.port), _Handler)
    print(f"http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
