"""An OpenAI-compatible HTTP endpoint over a candidate's server (`servers.serve(engine)`).

POST /v1/completions (prompt = text or token ids; `stream: true` sends one server-sent event per token),
GET /v1/models, GET /health. Decoding is greedy and every request produces exactly max_tokens (stop tokens
are ignored, as with vLLM's ignore_eos), so sampling options are accepted and have no effect.
"""
from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import socket
import threading
import time
import uuid
from contextlib import suppress

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from experiments.core.errors import ConfigError
from experiments.core.request import Prompt, RequestRecord

DEFAULT_HOST = "127.0.0.1"
# Only a failed or stopped request goes unannounced (tokens wake the handler at once): how often to look.
FAILURE_POLL_S = 0.05


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")      # temperature, top_p, ...: greedy decoding ignores them
    model: StrictStr | None = None
    prompt: StrictStr | list[StrictInt]
    max_tokens: StrictInt = Field(16, ge=1)         # OpenAI's default
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = True                   # accepted either way: our engines never stop early
    n: StrictInt = Field(1, ge=1, le=1)


class EngineFailed(Exception):
    pass


def create_app(server, tokenizer, model_name: str) -> FastAPI:
    """`server` is anything with submit(prompt) -> RequestRecord (SequentialServer, BatchingServer, ...)."""
    app = FastAPI(title="roi-ladder", docs_url=None, redoc_url=None, openapi_url=None)
    stats, metrics = ServerStats(), CollectorRegistry(auto_describe=True)
    metrics.register(stats)
    created = int(time.time())
    vocab = len(tokenizer)
    ids = itertools.count()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        return error(400, problems or "invalid request")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "roi-ladder"}]}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        if req.model is not None and req.model != model_name:
            return error(404, f"the model {req.model!r} does not exist; this endpoint serves {model_name!r}",
                         "model_not_found", "model")
        token_ids = tokenizer.encode(req.prompt) if isinstance(req.prompt, str) else req.prompt
        if not token_ids:
            return error(400, "prompt is empty", param="prompt")
        if bad := [t for t in token_ids if not 0 <= t < vocab]:
            return error(400, f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="prompt")
        rec = server.submit(Prompt(next(ids), tuple(token_ids), req.max_tokens))
        stats.submitted(rec)
        chunk = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                 "model": model_name}
        usage = {"prompt_tokens": len(token_ids), "completion_tokens": req.max_tokens,
                 "total_tokens": len(token_ids) + req.max_tokens}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_events(rec, tokenizer, chunk, usage if include_usage else None),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        feed, tokens = TokenFeed(rec), []
        try:
            while len(tokens) < req.max_tokens and (new := await feed.next()):
                tokens += new
        except EngineFailed as exc:
            return error(500, f"the engine failed: {exc}", "server_error")
        finally:
            feed.close()
        if len(tokens) < req.max_tokens:
            return error(500, "the server stopped the request early", "server_error")
        choice = {"index": 0, "text": tokenizer.decode(tokens, skip_special_tokens=True), "logprobs": None,
                  "finish_reason": "length"}
        return {**chunk, "choices": [choice], "usage": usage}

    return app


class ServerStats:
    """GET /metrics in Prometheus' format, as vLLM's server answers it: requests received and running, prompt
    and generated tokens, counted from the requests' records when scraped."""

    def __init__(self):
        self.requests = self.prompt_tokens = self.generated_tokens = 0
        self._live: list[RequestRecord] = []
        self._lock = threading.Lock()

    def submitted(self, rec: RequestRecord) -> None:
        with self._lock:
            self.requests += 1
            self.prompt_tokens += len(rec.prompt.token_ids)
            self._live.append(rec)

    def collect(self):
        with self._lock:
            done = [r for r in self._live if r.done.is_set()]
            self.generated_tokens += sum(len(r.tokens) for r in done)
            self._live = [r for r in self._live if not r.done.is_set()]
            running = len(self._live)
        yield CounterMetricFamily("roi_ladder_requests", "Completion requests received.", value=self.requests)
        yield GaugeMetricFamily("roi_ladder_num_requests_running", "Requests submitted and not finished.",
                                value=running)
        yield CounterMetricFamily("roi_ladder_prompt_tokens", "Prompt tokens received.", value=self.prompt_tokens)
        yield CounterMetricFamily("roi_ladder_generation_tokens", "Tokens generated by finished requests.",
                                  value=self.generated_tokens)


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status)


async def _events(rec: RequestRecord, tokenizer, chunk: dict, usage: dict | None):
    """One completion chunk per token, the last with finish_reason "length", then [DONE]."""
    want = rec.prompt.max_new_tokens
    feed, text, produced = TokenFeed(rec), Detokenizer(tokenizer), 0
    try:
        while produced < want and (new := await feed.next()):
            for token in new:
                produced += 1
                last = produced == want
                choice = {"index": 0, "text": text.add(token, final=last), "logprobs": None,
                          "finish_reason": "length" if last else None}
                yield _sse({**chunk, "choices": [choice]})
        if produced < want:
            raise EngineFailed("the server stopped the request early")
        if usage is not None:
            yield _sse({**chunk, "choices": [], "usage": usage})
    except EngineFailed as exc:   # the status line is long gone: report it in the stream, as vLLM does
        yield _sse({"error": {"message": f"the engine failed: {exc}", "type": "server_error", "param": None,
                              "code": None}})
    finally:
        feed.close()
    yield "data: [DONE]\n\n"


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class TokenFeed:
    """A request's tokens as they arrive, for the event loop: the server's thread wakes the loop per token."""

    def __init__(self, rec: RequestRecord):
        self.rec, self.seen = rec, 0
        self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        rec.tokens.listener = self._wake

    def _wake(self) -> None:
        # Runs in the server's thread; a loop already closed (shutdown) must not fail the engine's step.
        with suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._arrived.set)

    async def next(self) -> list[int]:
        """The tokens produced since the last call, waiting for one; [] once the request is over."""
        while True:
            self._arrived.clear()
            done = self.rec.done.is_set()    # read before the tokens, so none can slip in between
            new = self.rec.tokens[self.seen:]
            if new or done:
                self.seen += len(new)
                if not new and self.rec.error:
                    raise EngineFailed(self.rec.error)
                return new
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), FAILURE_POLL_S)

    def close(self) -> None:
        self.rec.tokens.listener = None
        if self.seen < self.rec.prompt.max_new_tokens and not self.rec.done.is_set():
            self.rec.cancelled = True        # the client went away: free the engine


class Detokenizer:
    """Text per token. Byte-level BPE splits characters across tokens, so a token that ends inside a character
    yields "" and its text comes with the next one (the prefix/read offsets TGI and vLLM use)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.prefix, self.read = tokenizer, [], 0, 0

    def add(self, token: int, final: bool = False) -> str:
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        text = self.tokenizer.decode(self.ids[self.prefix:], skip_special_tokens=True)
        if final or (len(text) > len(before) and not text.endswith("\ufffd")):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(before):]
        return ""


# --- listening --------------------------------------------------------------------------------------------
def bind(host: str = DEFAULT_HOST, port: int = 0) -> socket.socket:
    """Bind before building anything, so a port in use is one clear error (and port 0 reports the port it got)."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"port {port} is out of range", "pick a port in 1-65535 (0 picks a free one)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             proto=socket.IPPROTO_TCP)[0]
        # proto must say TCP: asyncio sets TCP_NODELAY only on such sockets, and without it Nagle holds each
        # token's chunk until the client's delayed ACK (~40 ms on a keep-alive connection).
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        return sock
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                          "pick another --port or --host, or stop what holds it") from None


def exposure_warning(host: str) -> str | None:
    """A warning when the endpoint is reachable from other machines: it has no authentication."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
        if all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
            return None
    except (OSError, ValueError):
        pass
    return (f"listening on {host}: anyone who can reach this machine can use the model (no authentication); "
            f"bind {DEFAULT_HOST} unless you mean it")


def _uvicorn(app) -> uvicorn.Server:
    # No access log: a line per request would cost more than a tiny model's step.
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                         timeout_graceful_shutdown=5))


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def run_forever(app, sock: socket.socket) -> None:
    """Serve in the foreground until Ctrl-C (uvicorn handles the signal and drains open requests)."""
    _uvicorn(app).run(sockets=[sock])


class BackgroundServer:
    """The app on uvicorn in a thread of this process: for tests and in-process checks."""

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0, start_timeout_s: float = 10.0):
        self._sock = bind(host, port)
        self.address, self.url = self._sock.getsockname()[:2], url_of(self._sock)
        self._server = _uvicorn(app)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="roi-http-server", daemon=True)
        self._thread.start()
        deadline = time.perf_counter() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.perf_counter() > deadline:
                self.close()
                raise RuntimeError(f"the HTTP server on {self.url} did not start")
            time.sleep(0.01)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
