"""The gate's HTTP API (FastAPI): the app, its API token, request limits and error handling.

Its routes: the release API (``gate.serve._release_api``: ``GET /ready`` answers 200 when a record
is released and 425 Too Early when it is not yet, the body naming the dependency groups that
are behind and by how much; ``wait=<seconds>`` turns it into a long-poll) and the operator's
(``gate.serve._status_api``). Errors are always JSON: ``{"error": <code>, "message": <one line>}``.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from gate.serve._bodies import ERROR_RESPONSES, ApiError
from gate.serve._limits import RequestLimits
from gate.serve._release_api import add_release_routes
from gate.serve._status_api import add_status_routes
from gate.service._service import GateService

log = logging.getLogger("gate.api")


def create_app(service: GateService, *, manage_service: bool = True) -> FastAPI:
    """Build the API around a service; with ``manage_service`` the app starts and stops it."""
    settings = service.config.http

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_service:
            await service.start()
        try:
            yield
        finally:
            if manage_service:
                await service.stop()

    token = settings.api_token.get_secret_value().encode() if settings.api_token else None

    async def authorize(authorization: Annotated[str | None, Header()] = None) -> None:
        if token is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token):
            raise ApiError(
                401, "unauthorized", "missing or wrong API token (Authorization: Bearer ...)"
            )

    protected = [Depends(authorize)] if token else []
    # The API's docs pages (/docs, /redoc) are served from the package: no CDN needed.
    app = FastAPIOffline(
        title="Kafka dependency gate",
        version="0.1.0",
        description=(
            "Per-partition watermarks of consumer-group dependencies. A record (topic, "
            "partition, offset) is released when every dependency group has committed past "
            "it, i.e. offset < watermark."
        ),
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"]
        )
    _install_error_handlers(app)
    app.add_middleware(
        RequestLimits,
        max_body_bytes=settings.max_body_bytes,
        rate=settings.rate_limit_per_s,
        burst=settings.rate_limit_burst,
    )

    add_release_routes(app, service, protected)
    add_status_routes(app, service, protected)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.code, "message": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors():
            loc = [
                str(part)
                for part in error.get("loc", ())
                if part not in ("query", "body", "path", "header")
            ]
            problems.append(f"{'.'.join(loc) or 'request'}: {error.get('msg', 'invalid')}")
        return JSONResponse(
            {"error": "invalid_request", "message": "; ".join(problems) or "invalid request"},
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}
        return JSONResponse(
            {"error": codes.get(exc.status_code, "http_error"), "message": str(exc.detail)},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        return JSONResponse(
            {"error": "internal", "message": "internal error; the gate's log has the details"},
            status_code=500,
        )
