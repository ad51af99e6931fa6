"""An OpenAI-compatible endpoint (ours from `roi-ladder serve`, or vLLM, TGI, ...) as the benchmark's server.

submit() hands the request to an asyncio loop in a background thread and returns at once, so the load loops
drive it as they drive an in-process server and the load generator does not become the bottleneck. Every
request streams (SSE) and is timed at the socket (experiments/serving/sse_client.py): the send just before
its prebuilt bytes are written, each chunk as the loop receives it; one chunk is one token, as vLLM and our
server stream. The load generator's own work stays off that path: request bodies (and text prompts'
decoding) are built before the send is stamped, chunks' JSON is parsed after the stream is over. What happens
inside the endpoint (queueing vs compute) is not observable from here, so `engine_start` stays None and
queue/model time are absent from the results rather than invented.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading

import aiohttp

from experiments.core.errors import ConfigError
from experiments.core.request import Prompt, RequestRecord
from experiments.serving.sse_client import EndpointFailed, HttpStatus, MalformedStream, Stream, StreamingClient

PROMPT_FORMATS = ("ids", "text")
START_HINT = "start one with `roi-ladder serve` or check the URL"


def check_url(url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"endpoint URL {url!r} is not an http(s) URL", "e.g. --endpoint http://127.0.0.1:8000")


class EndpointServer:
    """submit(prompt) -> RequestRecord and close(), like SequentialServer, over HTTP."""

    def __init__(self, url: str, model: str | None = None, prompt_format: str = "ids", tokenizer=None,
                 timeout_s: float = 30.0, probe_timeout_s: float = 5.0):
        """Probes GET /v1/models before any load; `model` defaults to the first model the endpoint lists.
        prompt_format "text" sends the prompts decoded by `tokenizer` (the endpoint tokenizes them again)."""
        check_url(url)
        if prompt_format not in PROMPT_FORMATS:
            raise ConfigError(f"prompt format {prompt_format!r} is unknown", f"use one of {', '.join(PROMPT_FORMATS)}")
        if prompt_format == "text" and tokenizer is None:
            raise ConfigError("prompt format 'text' needs the target's tokenizer", "pass tokenizer=...")
        self.url = url.rstrip("/").removesuffix("/v1")   # the OpenAI client's base URL works too
        self.prompt_format, self.tokenizer, self.timeout_s = prompt_format, tokenizer, timeout_s
        self._bodies: dict[Prompt, bytes] = {}
        self._session: aiohttp.ClientSession | None = None
        self._streams = StreamingClient(self.url)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="roi-endpoint-client", daemon=True)
        self._thread.start()
        try:
            self.model = self._call(self._open(model, probe_timeout_s))
        except BaseException:
            self.close()
            raise

    def prepare(self, prompts) -> None:
        """Build the requests of these prompts now, so that none is built (or decoded) while the load runs."""
        for prompt in prompts:
            self._request_bytes(prompt)

    def submit(self, prompt: Prompt, intended: float | None = None) -> RequestRecord:
        """Closed loop (no `intended`): latency counts from the send at the socket; open loop: from `intended`,
        and the lag to the actual send is the record's send lag."""
        rec = RequestRecord.arriving(prompt, intended)
        request = self._request_bytes(prompt)
        self._loop.call_soon_threadsafe(self._start, rec, request, intended is None)
        return rec

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self._shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()

    # --- in the client's loop -----------------------------------------------------------------------------
    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _open(self, model: str | None, probe_timeout_s: float) -> str:
        # No connection limit: the load loops decide how many requests are in flight.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                              timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        unreachable = f"endpoint {self.url} is unreachable"
        try:
            async with self._session.get(f"{self.url}/v1/models",
                                         timeout=aiohttp.ClientTimeout(total=probe_timeout_s)) as resp:
                body = await resp.text(errors="replace")
        except asyncio.TimeoutError:
            raise ConfigError(f"{unreachable}: no answer to GET /v1/models within {probe_timeout_s:g} s",
                              START_HINT) from None
        except aiohttp.ClientError as exc:
            raise ConfigError(f"{unreachable}: {_reason(exc)}", START_HINT) from None
        if resp.status != 200:
            raise ConfigError(f"{unreachable}: GET /v1/models answered HTTP {resp.status}: {_excerpt(body)}",
                              START_HINT)
        try:
            served = [m["id"] for m in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"endpoint {self.url} answered GET /v1/models with no OpenAI model list: "
                              f"{_excerpt(body)}", "point --endpoint at an OpenAI-compatible server") from None
        if model is None:
            if not served:
                raise ConfigError(f"endpoint {self.url} lists no models", "pass --model NAME")
            return served[0]
        if model not in served:
            raise ConfigError(f"endpoint {self.url} does not serve model {model!r} (it lists: "
                              f"{', '.join(served) or 'none'})", "pass --model with one of those")
        return model

    async def _shutdown(self) -> None:
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self._streams.close()
        if self._session is not None:
            await self._session.close()

    def _start(self, rec: RequestRecord, request: bytes, from_send: bool) -> None:
        self._loop.create_task(self._request(rec, request, from_send))

    async def _request(self, rec: RequestRecord, request: bytes, from_send: bool) -> None:
        stream, failed = Stream(), None
        try:
            try:
                await asyncio.wait_for(self._streams.post(request, stream), self.timeout_s)
            except (HttpStatus, MalformedStream, OSError) as exc:
                failed = exc                  # after the chunks that came before it, which may say more
            if stream.sent:
                rec.sent = stream.sent
                if from_send:
                    rec.arrival = stream.sent
            reported = 0
            for arrived, payload in stream.events:
                reported = _on_chunk(rec, payload, arrived) or reported
            if failed is not None:
                raise failed
            if not rec.token_times:   # else it would be neither ok nor an error: invisible in the rates
                raise EndpointFailed("the stream ended with no tokens")
            # The closing usage, where sent, says how many tokens there were: a server may send several in one
            # chunk (vLLM under load), those not seen apart are stamped at the last chunk's arrival, when the
            # client had them; or close with a chunk that carries none (llama-server's finish_reason), dropped.
            if reported:
                rec.token_times.extend([rec.token_times[-1]] * max(0, reported - len(rec.token_times)))
                del rec.token_times[reported:]
            if len(rec.token_times) < rec.prompt.max_new_tokens:
                # A server that cuts streams short (llama-cpp-python's interrupt_requests) would read as fast.
                raise EndpointFailed(f"the stream ended after {len(rec.token_times)} of the "
                                     f"{rec.prompt.max_new_tokens} tokens asked for")
        except HttpStatus as exc:
            rec.error = f"HTTP {exc.status}: {_excerpt(exc.body)}"
        except MalformedStream as exc:
            rec.error = f"malformed SSE: {exc}"
        except EndpointFailed as exc:
            rec.error = f"endpoint error: {exc}"
        except asyncio.TimeoutError:
            rec.timed_out = True
        except OSError as exc:
            rec.error = f"connection error: {_reason(exc)}"
        except Exception as exc:  # counted and shown, never a request that silently produced nothing
            rec.error = f"client error: {type(exc).__name__}: {exc}"
        finally:
            rec.done.set()

    def _request_bytes(self, prompt: Prompt) -> bytes:
        if prompt not in self._bodies:
            text = (list(prompt.token_ids) if self.prompt_format == "ids"
                    else self.tokenizer.decode(prompt.token_ids))
            body = {"model": self.model, "prompt": text, "max_tokens": prompt.max_new_tokens, "stream": True,
                    "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
            self._bodies[prompt] = self._streams.request("/v1/completions", json.dumps(body).encode())
        return self._bodies[prompt]


def _on_chunk(rec: RequestRecord, payload: str, arrived: float) -> int | None:
    """Stamps a token chunk's arrival; returns the completion tokens a closing usage chunk reports."""
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise MalformedStream(f"a chunk that is not JSON: {_excerpt(payload)}") from None
    if not isinstance(chunk, dict):
        raise MalformedStream(f"a chunk that is not a JSON object: {_excerpt(payload)}")
    if "error" in chunk:
        err = chunk["error"]
        raise EndpointFailed(_excerpt(err.get("message", err) if isinstance(err, dict) else err))
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        raise MalformedStream(f"a chunk without choices: {_excerpt(payload)}")
    if choices:                               # [] with usage only: the closing summary, not a token
        rec.token_times.append(arrived)
    usage = chunk.get("usage")
    return int(usage.get("completion_tokens") or 0) if isinstance(usage, dict) else None


def _reason(exc: Exception) -> str:
    os_error = getattr(exc, "os_error", exc)     # aiohttp's connector error wraps the OSError
    if isinstance(os_error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(os_error, socket.gaierror):
        return f"unknown host ({os_error.strerror})"
    return f"{type(exc).__name__}: {exc}"


def _excerpt(text, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + " ..."
