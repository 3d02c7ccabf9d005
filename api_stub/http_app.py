"""The HTTP facade, for agent engines not written in Python: the same MemoryClient behind a few endpoints.

    POST   /v1/episodes                 202 {episode_id, task_id}    validate + enqueue, never waits for the LLM
    POST   /v1/recall                   200 MemoryContext            degraded (not an error) when a store is down
    DELETE /v1/users/{user_id}/memory   200 ForgetReport             idempotent erasure
    DELETE /v1/users/{user_id}/episodes/{episode_id}   200 ForgetPartReport   one episode, idempotent
    DELETE /v1/users/{user_id}/sessions/{session_id}   200 ForgetPartReport   one session, idempotent
    GET    /v1/users/{user_id}/memory/export   200 application/x-ndjson   everything kept about the user, streamed
    GET    /healthz                     200 / 503                    no token needed; says only up or down,
                                                                 probes the stores at most once per 2 s
    GET    /metrics                     Prometheus text              see api_stub/metrics.py
    GET    /openapi.json, /docs         the OpenAPI document

Every endpoint but /healthz and the OpenAPI document needs `Authorization: Bearer <MEMORY_HTTP_TOKEN>`; the
app refuses to start without a token unless MEMORY_HTTP_AUTH_DISABLED=true. Bodies over
MEMORY_HTTP_MAX_BODY_BYTES get 413 before they are parsed, and a request without the token gets 401 before its
body is read. Invalid input gets 422 with the field and the
reason, and nothing is enqueued or written.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import unquote

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from api_stub.client import EpisodeReceipt, ForgetReport, MemoryClient
from api_stub.forget_part import ForgetPartReport
from api_stub.health_probe import CachedHealth
from api_stub.http_limits import BodySizeLimit
from api_stub.metrics import registry
from worker.errors import EpisodeRejected, QueryRejected, QueueFull, SettingsError, StoreError, broker_errors
from worker.models import MemoryContext
from worker.settings import Settings

log = logging.getLogger(__name__)
_BEARER = HTTPBearer(auto_error=False)  # module level: annotations are resolved from module globals


class MessageIn(BaseModel):
    role: str = Field(description="user, assistant, system or tool")
    content: str


class EpisodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: str
    session_id: str
    messages: list[MessageIn]
    episode_id: str | None = Field(None, description="Your own id; default: derived from user, session, messages.")
    occurred_at: datetime | None = None


class RecallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: str
    query: str
    limit: int | None = Field(None, description="Episodes to return (1..100); default MEMORY_RECALL_LIMIT.")
    budget_ms: int | None = Field(None, ge=10, le=60_000, description="Time allowed; default MEMORY_RECALL_BUDGET_MS.")
    strict: bool = Field(False, description="Answer 503 instead of a degraded empty context when a store is down.")
    as_of: AwareDatetime | None = Field(None, description="Answer as of this time (timezone-aware).")


class Problem(BaseModel):
    error: str
    field: str | None = None
    reason: str


def _problem(status: int, error: str, reason: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(Problem(error=error, field=field, reason=reason).model_dump(), status_code=status)


def create_app(settings: Settings, client: MemoryClient | None = None) -> FastAPI:
    if settings.http_token is None and not settings.http_auth_disabled:
        raise SettingsError(["MEMORY_HTTP_TOKEN: required (or set MEMORY_HTTP_AUTH_DISABLED=true, local use only)"])
    memory = client or MemoryClient(settings)
    token = settings.http_token.get_secret_value().encode() if settings.http_token else None

    def authorised(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        if token is None:
            return
        given = credentials.credentials.encode() if credentials else b""
        if not secrets.compare_digest(given, token):
            raise _Unauthorised

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if client is None:  # a client handed in belongs to the caller
            memory.close()

    app = FastAPI(
        lifespan=lifespan,
        title="Memory service",
        version="1",
        summary="Remember what each user said across conversations; recall it in milliseconds.",
    )
    app.add_middleware(BodySizeLimit, max_bytes=settings.http_max_body_bytes, token=token)
    guarded = [Depends(authorised)]

    @app.exception_handler(_Unauthorised)
    def _unauthorised(_: Request, __: Exception) -> JSONResponse:
        response = _problem(401, "unauthorised", "a valid bearer token is required")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @app.exception_handler(RequestValidationError)
    def _invalid(_: Request, exc: Exception) -> JSONResponse:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        first = errors[0] if errors else {"loc": (), "msg": str(exc)}
        loc = list(first["loc"])
        if loc and loc[0] in ("body", "path", "query", "header"):  # where it was, not which field
            loc = loc[1:]
        field = ".".join(str(p) for p in loc) or None
        return _problem(422, "invalid_request", str(first["msg"]), field)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: Exception) -> Response:
        """FastAPI's 400 for a body it could not decode (not UTF-8, an integer of thousands of digits, nesting
        past the recursion limit) is an invalid request like any other: 422 with the problem body."""
        if isinstance(exc, StarletteHTTPException) and exc.status_code == 400:
            return _problem(422, "invalid_request", "the body is not JSON text this service can read")
        return await http_exception_handler(request, exc)  # type: ignore[arg-type]

    @app.exception_handler(EpisodeRejected)
    @app.exception_handler(QueryRejected)
    def _rejected(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, EpisodeRejected | QueryRejected)
        return _problem(422, "invalid_request", exc.reason, exc.field)

    def _queue_down(_: Request, exc: Exception) -> JSONResponse:
        return _problem(503, "unavailable", f"queue unavailable ({type(exc).__name__})")

    @app.exception_handler(QueueFull)
    def _queue_full(_: Request, exc: Exception) -> JSONResponse:
        response = _problem(503, "queue_full", str(exc))
        response.headers["Retry-After"] = "5"
        return response

    for broker_error in broker_errors():
        app.add_exception_handler(broker_error, _queue_down)

    @app.exception_handler(StoreError)
    def _store_down(_: Request, exc: Exception) -> JSONResponse:
        cause = exc.cause if isinstance(exc, StoreError) and exc.cause else type(exc).__name__
        return _problem(503, "unavailable", f"graph store unavailable ({cause})")

    problems: dict[int | str, dict[str, Any]] = {422: {"model": Problem}, 503: {"model": Problem}}

    @app.post("/v1/episodes", status_code=202, dependencies=guarded, responses=problems)
    def add_episode(body: EpisodeIn) -> EpisodeReceipt:
        messages = [m.model_dump() for m in body.messages]
        episode = memory.validate(
            body.user_id, body.session_id, messages, episode_id=body.episode_id, occurred_at=body.occurred_at
        )
        return memory.enqueue(episode)

    @app.post("/v1/recall", dependencies=guarded, responses=problems)
    def recall(body: RecallIn) -> MemoryContext:
        return memory.retrieve_memory(
            body.user_id, body.query, limit=body.limit, budget_ms=body.budget_ms, strict=body.strict, as_of=body.as_of
        )

    # Ids may hold "/" (sent as %2F), and the server decodes the path before routing: which of the three
    # routes matched says nothing. Each reads the raw path (segments split before decoding) and does what
    # it names, so `DELETE /v1/users/a%2Fsessions/memory` erases user "a/sessions", never a session.
    def forget_target(request: Request) -> JSONResponse:
        parts = _raw_parts(request)
        if len(parts) == 5 and parts[:3] == ["", "v1", "users"] and parts[4] == "memory":
            report: BaseModel = memory.forget_user(parts[3])
        elif len(parts) == 6 and parts[:3] == ["", "v1", "users"] and parts[4] == "episodes":
            report = memory.forget_episode(parts[3], parts[5])
        elif len(parts) == 6 and parts[:3] == ["", "v1", "users"] and parts[4] == "sessions":
            report = memory.forget_session(parts[3], parts[5])
        else:
            return _problem(404, "not_found", "no such resource (a / inside an id is sent as %2F)")
        return JSONResponse(report.model_dump(mode="json"))

    deleting = {**problems, 200: {"model": ForgetReport}}
    parting = {**problems, 200: {"model": ForgetPartReport}}

    @app.delete("/v1/users/{user_id:path}/memory", dependencies=guarded, responses=deleting)
    def forget(user_id: str, request: Request) -> JSONResponse:
        return forget_target(request)

    @app.delete("/v1/users/{user_id:path}/episodes/{episode_id:path}", dependencies=guarded, responses=parting)
    def forget_episode(user_id: str, episode_id: str, request: Request) -> JSONResponse:
        return forget_target(request)

    @app.delete("/v1/users/{user_id:path}/sessions/{session_id:path}", dependencies=guarded, responses=parting)
    def forget_session(user_id: str, session_id: str, request: Request) -> JSONResponse:
        return forget_target(request)

    @app.get(
        "/v1/users/{user_id:path}/memory/export",
        dependencies=guarded,
        responses={**problems, 200: {"content": {"application/x-ndjson": {}}}},
        response_class=StreamingResponse,
    )
    def export(user_id: str, request: Request) -> Response:
        """Everything kept about the user, as JSON Lines (format: api_stub/export_format.py), streamed."""
        parts = _raw_parts(request)
        if len(parts) != 6 or parts[:3] != ["", "v1", "users"] or parts[4:] != ["memory", "export"]:
            return _problem(404, "not_found", "no such resource (a / inside an id is sent as %2F)")
        lines = memory.export_user(parts[3])  # the header is read here: a store that is down answers 503

        def streamed() -> Iterator[str]:
            try:
                yield from lines
            except Exception as exc:  # the status is sent: the body ends without its end line (incomplete)
                log.error("export stopped", extra={"user_id": parts[3], "error_class": type(exc).__name__})

        return StreamingResponse(streamed(), media_type="application/x-ndjson")

    health = CachedHealth(memory.health)  # open to anyone: at most one probe of the stores per 2 s

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        checks: dict[str, Any] = health()
        ok = all(checks.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", **checks}, status_code=200 if ok else 503)

    scraped = registry(memory.redis, memory.recall_counters)  # reads nothing until scraped

    @app.get("/metrics", dependencies=guarded, response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(scraped), media_type=CONTENT_TYPE_LATEST)

    return app


def _raw_parts(request: Request) -> list[str]:
    """The path's segments, split before they are decoded (an id may hold %2F)."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    return [unquote(p) for p in raw.decode("latin-1").split("?")[0].split("/")]


class _Unauthorised(Exception):
    pass
