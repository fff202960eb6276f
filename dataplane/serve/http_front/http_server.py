"""uvicorn serving the OpenAI-compatible app on the data plane's own event loop.

The DataPlane and its request streams belong to one event loop (the gRPC server's), so
uvicorn runs there as a task, not in a thread. The socket is bound at construction, so
port 0 is resolved before anything starts and connections queue until `start`.

Connections are accepted here (`_Acceptor`), not by asyncio's server: on EMFILE asyncio
logs a traceback and schedules a retry for every accept left in its batch (uvicorn's batch is
its backlog, 2048), each retry doing the same, a storm that starves the loop. Connections
are bounded (`HttpLimits`), because every one holds a file descriptor the gRPC side needs
too and an idle or half-sent request must not hold it for ever:

    open connections  > max_connections    -> 503 and closed at accept, before any parsing
    request head      > receive_timeout_s  -> closed (uvicorn times out only idle keep-alive)
    request body      > receive_timeout_s  -> 408 (openai_app.read_body)
    request body      > max_body_bytes     -> 413 before it is read (openai_app.read_body)
    head bytes        > max_head_bytes     -> 400, OpenAI's shape (h11's incomplete-event limit)
    idle keep-alive   > keep_alive_timeout_s -> closed (uvicorn's own timeout_keep_alive)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import resource
import socket
import time
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("rimuru.serve")

_GRACEFUL_S = 1.0  # after the plane has drained: open connections only need their last bytes
_FDS_PER_CONNECTION_SHARE = 2  # HTTP may use at most half the descriptors the process has
_LISTEN_BACKLOG = 2048  # uvicorn's default: a burst of connects waits here, not in SYN retries
_ACCEPT_BATCH = 64  # accepts a wake-up: descriptors past the cap live only until connection_made
_ACCEPT_RETRY_S = 1.0  # out of descriptors: listen again after this long (asyncio's delay)
_EXHAUSTED_LOG_S = 60.0  # and say so at most this often
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@dataclass(frozen=True)
class HttpLimits:
    """Bounds of the HTTP front; `rimuru serve --http-*` flags set them (docs/serving.md)."""

    max_body_bytes: int = 4 * 1024 * 1024  # as gRPC's message limit (rimuru.rpc)
    max_connections: int = 4096
    receive_timeout_s: float = 30.0  # for the request head, and again for the body
    keep_alive_timeout_s: float = 5.0  # uvicorn's and vLLM's default
    max_head_bytes: int = 16 * 1024  # request line and headers; h11's default

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_connections", "max_head_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        for name in ("receive_timeout_s", "keep_alive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds; got {getattr(self, name)}")


def connection_cap(limits: HttpLimits) -> int:
    """max_connections, lowered to half the process's descriptor limit: past that an accept
    fails with EMFILE, and gRPC (and every file the engine opens) would fail with it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    return max(1, min(limits.max_connections, soft // _FDS_PER_CONNECTION_SHARE))


def _refusal(message: str, status: str, kind: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return (head + body).encode()


class _BoundedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol plus the bound it lacks: a deadline for a request head,
    from the connection's start or from the first byte of a keep-alive's next request
    (uvicorn times out only an idle keep-alive)."""

    def __init__(self, *args, receive_timeout_s: float, max_head_bytes: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._receive_timeout_s = receive_timeout_s
        self._max_head_bytes = max_head_bytes
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self._receiving_head():
            return
        self._cancel_head_deadline()

    def send_400_response(self, msg: str) -> None:
        # h11 refused the bytes (malformed, or a head over max_head_bytes): uvicorn's plain
        # text answer, in OpenAI's shape. The connection is done either way.
        message = (
            f"invalid HTTP request: a malformed request line or headers, or more than "
            f"{self._max_head_bytes} bytes of them"
        )
        self.transport.write(_refusal(message, "400 Bad Request", "invalid_request_error"))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        # The first bytes of a keep-alive connection's next request start its deadline (while
        # it idles, uvicorn's keep-alive timeout governs); a new connection's started at once.
        if self._head_deadline is None and self._receiving_head():
            self._await_head()
        super().data_received(data)

    def _receiving_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _await_head(self) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.loop.call_later(self._receive_timeout_s, self._head_overdue)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_overdue(self) -> None:
        self._head_deadline = None
        if self._receiving_head() and not self.transport.is_closing():
            self.transport.close()


class _Acceptor:
    """Accepts connections on a listening socket and hands each to a protocol. Past
    max_connections a connection is answered 503 and closed in the same step, so refused
    ones never pile up descriptors; out of descriptors all the same (gRPC holds many too),
    it stops listening for a second and logs one line a minute at most."""

    def __init__(self, sock: socket.socket, protocol_factory, max_connections: int) -> None:
        self._sock = sock
        self._protocol_factory = protocol_factory
        self._max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._last_warning = -_EXHAUSTED_LOG_S
        self._num_refused = 0  # accepts that failed for want of descriptors, since the warning
        # Every accepted socket until it is closed (its transport closes it when the
        # connection ends): the descriptors the cap is about. Counting uvicorn's live
        # protocols plus the transports still being made counted a connection twice between
        # its protocol's connection_made and the end of connect_accepted_socket, so a burst
        # was refused at half the cap.
        self._accepted: set[socket.socket] = set()
        self._connecting: set[asyncio.Task] = set()  # strong references: the loop's are weak

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock.setblocking(False)
        self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        if self._loop is not None and self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
        if self._retry is not None:
            self._retry.cancel()
        self._sock.close()

    def _accept(self) -> None:
        self._accepted = {conn for conn in self._accepted if conn.fileno() >= 0}
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                self._pause(exc)
                return
            conn.setblocking(False)
            if len(self._accepted) >= self._max_connections:
                self._refuse(conn)
                continue
            self._accepted.add(conn)
            task = self._loop.create_task(
                self._loop.connect_accepted_socket(self._protocol_factory, conn)
            )
            self._connecting.add(task)
            task.add_done_callback(functools.partial(self._connected, conn))

    def _refuse(self, conn: socket.socket) -> None:
        message = f"this server holds {self._max_connections} connections: retry later"
        with contextlib.suppress(OSError):  # a fresh socket's buffer takes it, or the client left
            conn.send(_refusal(message, "503 Service Unavailable", "service_unavailable_error"))
            # Read what the client already sent before closing: a close with unread bytes
            # makes the kernel answer with a reset, which can reach the client ahead of the
            # 503 (it would see ECONNRESET, not the refusal).
            conn.setblocking(False)
            conn.shutdown(socket.SHUT_WR)
            conn.recv(65536)
        conn.close()

    def _connected(self, conn: socket.socket, task: asyncio.Task) -> None:
        self._connecting.discard(task)
        if task.cancelled() or task.exception() is not None:
            conn.close()  # the client left before its transport existed

    def _pause(self, exc: OSError) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._retry = self._loop.call_later(_ACCEPT_RETRY_S, self._resume)
        self._num_refused += 1
        now = time.monotonic()
        if now - self._last_warning >= _EXHAUSTED_LOG_S:
            log.warning(
                "HTTP: out of file descriptors (%s); not accepting for %.0f s at a time "
                "(%d times since the last warning): raise the descriptor limit or lower "
                "--http-max-connections",
                exc.strerror,
                _ACCEPT_RETRY_S,
                self._num_refused,
            )
            self._last_warning, self._num_refused = now, 0

    def _resume(self) -> None:
        self._retry = None
        if self._sock.fileno() >= 0:
            self._loop.add_reader(self._sock.fileno(), self._accept)


class HttpServer:
    def __init__(self, app, host: str, port: int, limits: HttpLimits | None = None) -> None:
        limits = limits or HttpLimits()
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        dualstack = family == socket.AF_INET6 and socket.has_dualstack_ipv6()
        self._socket = socket.create_server(
            (host, port), family=family, dualstack_ipv6=dualstack, backlog=_LISTEN_BACKLOG
        )
        self.port: int = self._socket.getsockname()[1]
        self.max_connections = connection_cap(limits)
        if self.max_connections < limits.max_connections:
            log.warning(
                "HTTP connections capped at %d (half the descriptor limit), not %d",
                self.max_connections,
                limits.max_connections,
            )
        protocol = functools.partial(
            _BoundedH11,
            receive_timeout_s=limits.receive_timeout_s,
            max_head_bytes=limits.max_head_bytes,
        )
        config = uvicorn.Config(
            app,
            http=protocol,
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=limits.keep_alive_timeout_s,
            h11_max_incomplete_event_size=limits.max_head_bytes,
            timeout_graceful_shutdown=_GRACEFUL_S,
        )
        self._server = _Server(config, self._socket, self.max_connections)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Serve from now on (returns once uvicorn listens); call in the plane's loop."""
        self._task = asyncio.create_task(self._server.serve(sockets=[]))
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # raises why uvicorn did not start

    async def stop(self) -> None:
        if self._task is None:  # never started: only the bound socket to close
            self._socket.close()
            return
        self._server.should_exit = True
        await self._task


class _Server(uvicorn.Server):
    """uvicorn with its connections accepted by an _Acceptor on `sock` (uvicorn itself is
    given no socket, so it opens no asyncio server)."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket, max_connections: int) -> None:
        super().__init__(config)
        self._acceptor: _Acceptor | None = None
        self._sock = sock
        self._max_connections = max_connections

    @contextlib.contextmanager
    def capture_signals(self):
        yield  # SIGTERM/SIGINT belong to `rimuru serve`, which drains gRPC and HTTP together

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=[])
        factory = functools.partial(
            self.config.http_protocol_class,
            config=self.config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        self._acceptor = _Acceptor(self._sock, factory, self._max_connections)
        self._acceptor.start()

    async def shutdown(self, sockets=None) -> None:
        if self._acceptor is not None:
            self._acceptor.close()  # no new connections while the open ones finish
        await super().shutdown(sockets=[])
