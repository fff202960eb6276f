"""uvicorn serving the OpenAI-compatible app on the data plane's own event loop.

The DataPlane and its request streams belong to one event loop (the gRPC server's), so
uvicorn runs there as a task, not in a thread. The socket is bound at construction, so
port 0 is resolved before anything starts and connections queue until `start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn

_GRACEFUL_S = 1.0  # after the plane has drained: open connections only need their last bytes


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        yield  # SIGTERM/SIGINT belong to `rimuru serve`, which drains gRPC and HTTP together


class HttpServer:
    def __init__(self, app, host: str, port: int) -> None:
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        dualstack = family == socket.AF_INET6 and socket.has_dualstack_ipv6()
        self._socket = socket.create_server((host, port), family=family, dualstack_ipv6=dualstack)
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=_GRACEFUL_S,
        )
        self._server = _Server(config)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Serve from now on (returns once uvicorn listens); call in the plane's loop."""
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # raises why uvicorn did not start

    async def stop(self) -> None:
        if self._task is None:
            self._socket.close()
            return
        self._server.should_exit = True
        await self._task
