"""A plain TCP connection for an asyncio protocol, read with recvmsg for the kernel's receive timestamp.

asyncio's own transports read with recv(), so the earliest a protocol can stamp is when the loop gets round to
it: after its wake-up, the interpreter lock and any callbacks ahead in the same iteration (~0.1-0.3 ms on a
busy machine, more under load). With SO_TIMESTAMPNS the kernel stamps each segment as it arrives at the socket;
this transport hands that instant to `data_received(data, at)`, converted to perf_counter's clock. Linux only;
elsewhere (or for TLS) the client uses asyncio's transport and stamps in the callback.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)   # Linux's value; Python does not export it
RECV_BYTES = 256 * 1024
ANCILLARY = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
SUPPORTED = sys.platform.startswith("linux") and ANCILLARY > 0


async def open_stamped(protocol_factory, host: str, port: int):
    """(transport, protocol) over a new connection whose reads carry the kernel's timestamp."""
    loop = asyncio.get_running_loop()
    family, kind, proto, _, address = (await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # each request leaves at once
        with contextlib.suppress(OSError):   # refused (a sandboxed kernel): reads come unstamped, stamped later
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        await loop.sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    protocol = protocol_factory()
    transport = StampedTransport(loop, sock, protocol)
    protocol.connection_made(transport)
    return transport, protocol


def kernel_time(ancillary) -> float | None:
    """The SO_TIMESTAMPNS stamp (CLOCK_REALTIME) on perf_counter's clock, or None if there is none."""
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
            sec, nsec = struct.unpack("qq", raw[:16])
            return (sec * 10**9 + nsec - (time.time_ns() - time.perf_counter_ns())) / 1e9
    return None


class StampedTransport:
    """write / close / is_closing, as the protocol uses an asyncio transport."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol):
        self._loop, self._sock, self._protocol = loop, sock, protocol
        self._closing = False
        loop.add_reader(sock.fileno(), self._readable)

    def write(self, data: bytes) -> None:
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            return self._lost(exc)
        if sent < len(data):                 # more than the socket buffer takes at once: the loop sends the rest
            task = self._loop.create_task(self._loop.sock_sendall(self._sock, data[sent:]))
            task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or self._lost(t.exception()))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._lost(None)

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self._sock.recvmsg(RECV_BYTES, ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            return self._lost(exc)
        if not data:
            return self._lost(None)
        self._protocol.data_received(data, kernel_time(ancillary))   # None: the protocol stamps it now

    def _lost(self, exc) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)
