"""Streaming completions over HTTP/1.1 on asyncio protocols, timestamped where the bytes cross the socket.

The send is stamped just before the request's bytes (built beforehand) go to the socket. Each receive takes
the kernel's receive timestamp where the connection has one (stamped_socket.py: plain TCP on Linux), else
perf_counter first thing in `data_received`, the callback the loop runs right after recv(): no HTTP library
between the socket and the clock either way. Only framing runs there (headers, chunked encoding, SSE lines);
the events' JSON is parsed once the stream is over. Connections are kept alive and reused, one request at a
time each.
"""
from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from urllib.parse import urlsplit

from experiments.serving import stamped_socket


class MalformedStream(Exception):
    pass


class EndpointFailed(Exception):
    pass


class HttpStatus(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body


class Stream:
    """A request's outcome: when it was sent and (arrival, payload) per SSE event up to [DONE]."""

    def __init__(self):
        self.sent = 0.0
        self.events: list[tuple[float, str]] = []


class _Connection(asyncio.Protocol):
    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.closed = self.reused = False
        self.ended: asyncio.Future | None = None   # the response's last byte is in (or it failed)

    # --- one exchange -------------------------------------------------------------------------------------
    def start(self, request: bytes, stream: Stream) -> asyncio.Future:
        """Sends `request`; the future is done at data: [DONE] (or an error), `ended` once the body is over."""
        loop = asyncio.get_running_loop()
        self.stream, self.done, self.ended = stream, loop.create_future(), loop.create_future()
        self.head, self.status, self.keep_alive, self.got_bytes = b"", 0, False, False
        self.body_left: int | None = None    # content-length framing: bytes still to come
        self.chunked, self.chunk_left, self.raw = False, 0, b""
        self.line, self.data, self.event_at, self.error_body = b"", [], 0.0, b""
        stream.sent = time.perf_counter()
        self.transport.write(request)
        return self.done

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.ended is None or self.ended.done():
            return
        if self.status and self.body_left is None and not self.chunked:   # the body ends with the connection
            self._body_end()
        self._fail(ConnectionError(f"the endpoint closed the connection{f' ({exc})' if exc else ''}"))

    def data_received(self, data: bytes, at: float | None = None) -> None:
        """`at`: the kernel's receive stamp, where the transport has one; else now, first thing."""
        now = time.perf_counter() if at is None else at
        if self.ended is None or self.ended.done():
            self.keep_alive = False          # bytes nobody asked for: this connection is not reused
            return
        self.got_bytes = True
        try:
            if not self.status:
                self.head += data
                if b"\r\n\r\n" not in self.head:
                    return
                self.head, _, data = self.head.partition(b"\r\n\r\n")
                self._headers()
            self._body(data, now)
        except (MalformedStream, HttpStatus, EndpointFailed) as exc:
            self._fail(exc)
        except ValueError as exc:
            self._fail(MalformedStream(f"bad HTTP framing: {exc}"))

    def _fail(self, exc: BaseException) -> None:
        self.keep_alive = False
        if not self.done.done():
            self.done.set_exception(exc)
        if not self.ended.done():
            self.ended.set_result(None)

    # --- framing ------------------------------------------------------------------------------------------
    def _headers(self) -> None:
        status_line, *lines = self.head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise MalformedStream(f"not an HTTP response: {status_line[:60]!r}")
        self.status = int(parts[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
        connection = headers.get("connection", "").lower()
        self.keep_alive = connection == "keep-alive" or (parts[0] == "HTTP/1.1" and connection != "close")
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if not self.chunked and "content-length" in headers:
            self.body_left = int(headers["content-length"])
        if not self.chunked and self.body_left is None:
            self.keep_alive = False
        content_type = headers.get("content-type", "")
        if self.status == 200 and not content_type.startswith("text/event-stream"):
            raise MalformedStream(f"the endpoint answered {content_type or 'no content type'}, "
                                  "not text/event-stream")

    def _body(self, data: bytes, now: float) -> None:
        if not self.chunked:
            if self.body_left is not None:
                data, self.body_left = data[:self.body_left], self.body_left - min(len(data), self.body_left)
            self._content(data, now)
            if self.body_left == 0:
                self._body_end()
            return
        self.raw += data
        while self.raw:
            if self.chunk_left == 0:
                size_line, sep, rest = self.raw.partition(b"\r\n")
                if not sep:
                    return
                size = int(size_line.split(b";")[0], 16)
                if size == 0:                # the last chunk, then an empty line (no trailers expected)
                    if rest.startswith(b"\r\n"):
                        self.raw = b""
                        self._body_end()
                    return
                self.raw, self.chunk_left = rest, size + 2   # the chunk and its CRLF
            take = self.raw[:self.chunk_left]
            self.raw, self.chunk_left = self.raw[len(take):], self.chunk_left - len(take)
            self._content(take[:len(take) - max(0, 2 - self.chunk_left)], now)

    def _content(self, data: bytes, now: float) -> None:
        if self.status != 200:
            self.error_body += data
            return
        self.line += data
        while b"\n" in self.line and not self.done.done():
            raw, _, self.line = self.line.partition(b"\n")
            try:
                line = raw.rstrip(b"\r").decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedStream(f"a line that is not UTF-8: {raw[:60]!r}") from None
            if line.startswith("data:"):
                if not self.data:
                    self.event_at = now
                self.data.append(line[5:].removeprefix(" "))
            elif not line and self.data:
                payload, self.data = "\n".join(self.data), []
                if payload == "[DONE]":
                    self.done.set_result(None)
                else:
                    self.stream.events.append((self.event_at, payload))
            # other lines (comments, event:, id:, retry:) carry nothing the benchmark uses

    def _body_end(self) -> None:
        if self.status != 200:
            self._fail(HttpStatus(self.status, self.error_body.decode("utf-8", "replace")))
        elif not self.done.done():
            self._fail(MalformedStream("the stream ended without data: [DONE]"))
        if not self.ended.done():
            self.ended.set_result(None)


class StreamingClient:
    """POSTs to one endpoint from inside an asyncio loop; `await post(path, body)` -> Stream."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host, self.prefix = parts.hostname or "", parts.path.rstrip("/")
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        netloc = self.host if parts.port is None else f"{self.host}:{self.port}"
        self.host_header = f"[{self.host}]" if ":" in self.host and parts.port is None else netloc
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    def request(self, path: str, body: bytes) -> bytes:
        """The whole request, built before it is timed."""
        return (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body

    async def post(self, request: bytes, stream: Stream, linger_s: float = 1.0) -> None:
        """Fills `stream` up to data: [DONE]; then waits up to `linger_s` for the body's end, to reuse the
        connection."""
        conn = await self._connection()
        try:
            try:
                await conn.start(request, stream)
            except ConnectionError:
                if not (conn.reused and not conn.got_bytes):
                    raise
                # a kept-alive connection the server had closed meanwhile: once more, on a new one
                self._release(conn)
                conn = await self._connection(fresh=True)
                await conn.start(request, stream)
            if not conn.ended.done():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(conn.ended), linger_s)
        except BaseException:
            conn.keep_alive = False
            raise
        finally:
            self._release(conn)

    async def close(self) -> None:
        for conn in list(self._open):
            conn.transport.close()
        self._open.clear()
        self._idle.clear()

    async def _connection(self, fresh: bool = False) -> _Connection:
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed and not conn.transport.is_closing():
                conn.reused = True
                return conn
            self._open.discard(conn)
        if self.ssl is None and stamped_socket.SUPPORTED:
            _, conn = await stamped_socket.open_stamped(_Connection, self.host, self.port)
        else:
            _, conn = await asyncio.get_running_loop().create_connection(
                _Connection, self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None)
        self._open.add(conn)
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.keep_alive and not conn.closed and conn.ended.done() and not conn.raw:
            self._idle.append(conn)
        else:
            self._open.discard(conn)
            conn.transport.close()
