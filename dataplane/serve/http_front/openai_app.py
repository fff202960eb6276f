"""The FastAPI app of the OpenAI-compatible API: routes, bearer auth, error objects, and
the bounded reading of request bodies. The handlers themselves are openai_api.py's.

Every answer, the framework's own included (unknown path, wrong method), is an OpenAI
error object; a body is refused before it is read when it declares too many bytes, and
as soon as it has sent too many otherwise (http_server.py bounds the connection itself).
"""

from __future__ import annotations

import asyncio
import hmac

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from rimuru.dataplane.serve.http_front.chat_template import ChatTemplate
from rimuru.dataplane.serve.http_front.http_server import HttpLimits
from rimuru.dataplane.serve.http_front.openai_api import OpenAIRoutes
from rimuru.dataplane.serve.http_front.openai_protocol import (
    BodyTooLarge,
    MethodNotAllowed,
    RequestTimeout,
    RouteNotFound,
    error_body,
    http_error,
)
from rimuru.dataplane.serve.plane.errors import QueueFull, ServeError
from rimuru.dataplane.serve.plane.plane import DataPlane

_RETRY_AFTER_S = "1"  # a full waiting queue drains within a few steps


def create_app(
    plane: DataPlane,
    chat_template: ChatTemplate,
    registry=None,
    api_token: str | None = None,
    limits: HttpLimits | None = None,
) -> FastAPI:
    """The HTTP app over `plane`; `registry`: the prometheus_client registry for /metrics;
    `api_token`: the /v1/ routes need `Authorization: Bearer <api_token>` (401 otherwise),
    /health and /metrics stay open, as gRPC health does; `limits`: the body's size and time
    to arrive (the HttpServer applies the rest)."""
    limits = limits or HttpLimits()
    app = FastAPI(title="rimuru", docs_url=None, redoc_url=None, openapi_url=None)
    routes = OpenAIRoutes(plane, chat_template)

    if api_token is not None:
        expected = f"Bearer {api_token}".encode()

        @app.middleware("http")
        async def bearer_token(request: Request, call_next):
            if request.url.path.startswith("/v1/"):
                presented = request.headers.getlist("authorization")
                if len(presented) != 1 or not hmac.compare_digest(presented[0].encode(), expected):
                    message = "this API needs one `Authorization: Bearer <token>` header"
                    body = error_body(message, "authentication_error")
                    return JSONResponse(body, status_code=401)
            return await call_next(request)

    @app.exception_handler(ServeError)
    async def serve_error(_request: Request, exc: ServeError) -> JSONResponse:
        status, body = http_error(exc)
        headers = {"Retry-After": _RETRY_AFTER_S} if isinstance(exc, QueueFull) else None
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(HTTPException)
    async def framework_error(request: Request, exc: HTTPException) -> JSONResponse:
        # The router's own answers (unknown path, wrong method) in OpenAI's shape too.
        if exc.status_code == 405:
            error = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
        elif exc.status_code == 404:
            error = RouteNotFound(f"no route {request.method} {request.url.path}")
        else:
            return JSONResponse(
                error_body(str(exc.detail), "invalid_request_error"),
                status_code=exc.status_code,
                headers=exc.headers,
            )
        status, body = http_error(error)
        return JSONResponse(body, status_code=status, headers=exc.headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        raw = await read_body(request, limits)
        return await routes.completions(raw, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        raw = await read_body(request, limits)
        return await routes.chat_completions(raw, request)

    @app.get("/v1/models")
    async def models() -> dict:
        return routes.models()

    @app.get("/health")
    async def health() -> Response:
        return routes.health()

    @app.get("/metrics")
    async def metrics() -> Response:
        if registry is None:
            return JSONResponse(error_body("no metrics here", "not_found_error"), status_code=404)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def read_body(request: Request, limits: HttpLimits) -> bytes:
    """The whole body, or BodyTooLarge as soon as it is known to exceed the limit (from
    Content-Length before a byte is read, else once the chunks received pass it), or
    RequestTimeout when it has not all arrived within receive_timeout_s."""
    max_bytes = limits.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(_too_large(max_bytes))
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.receive_timeout_s):
            async for part in request.stream():
                size += len(part)
                if size > max_bytes:
                    raise BodyTooLarge(_too_large(max_bytes))
                chunks.append(part)
    except TimeoutError:
        raise RequestTimeout(
            f"the request body did not arrive within {limits.receive_timeout_s:g} s "
            "(rimuru serve --http-receive-timeout)"
        ) from None
    return b"".join(chunks)


def _too_large(max_bytes: int) -> str:
    return (
        f"the request body is larger than {max_bytes} bytes, the most this server accepts "
        "(rimuru serve --http-max-body-bytes)"
    )
