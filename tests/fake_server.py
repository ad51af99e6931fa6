"""A stand-in for an engine's server (tests only): GET /health and /v1/models answer 503 until it is healthy,
then 200; POST /v1/completions streams `max_tokens` tokens, one every --token-ms, as an OpenAI-compatible server
does. Flags make it slow, crash, hang, ignore SIGTERM or start a child of its own, as real servers do; an unknown
flag ends it at once with argparse's error, as vLLM's own parser does.

    python tests/fake_server.py --port P [--health-after S] [--exit-at-start CODE] [--never-healthy]
                                [--crash-after S] [--spawn-child] [--ignore-term] [--model NAME] [--token-ms MS]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CRASH_CODE = 7


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--health-after", type=float, default=0.0)
    parser.add_argument("--exit-at-start", type=int)
    parser.add_argument("--never-healthy", action="store_true")
    parser.add_argument("--crash-after", type=float)
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--model", default="fake")
    parser.add_argument("--token-ms", type=float, default=5.0)
    args = parser.parse_args()
    began = time.monotonic()
    print(f"fake server starting on port {args.port}")
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.spawn_child:       # an engine worker: same process group, never told to stop by its parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(f"spawned worker {child.pid}")
    if args.exit_at_start is not None:
        print(f"fatal: the fake model does not fit (exit {args.exit_at_start})", file=sys.stderr)
        sys.exit(args.exit_at_start)
    if args.crash_after is not None:
        threading.Timer(args.crash_after, crash).start()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            healthy = not args.never_healthy and time.monotonic() - began >= args.health_after
            status = 404 if self.path not in ("/health", "/v1/models") else 200 if healthy else 503
            body = json.dumps({"object": "list", "data": [{"id": args.model}]}).encode() \
                if status == 200 and self.path == "/v1/models" else b""
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for _ in range(int(request["max_tokens"])):
                time.sleep(args.token_ms / 1000)
                self._event({"choices": [{"index": 0, "text": "a", "finish_reason": None}]})
            self._event({"choices": [], "usage": {"completion_tokens": int(request["max_tokens"])}})
            self.wfile.write(b"data: [DONE]\n\n")

        def _event(self, chunk: dict) -> None:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print("loading the fake weights")
    server.serve_forever(poll_interval=0.05)


def crash() -> None:
    print("fake server: segfault in the fake kernel", flush=True)
    os._exit(CRASH_CODE)


if __name__ == "__main__":
    main()
