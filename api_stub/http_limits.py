"""ASGI middleware: refuse unauthenticated requests with 401 before their body is read, then bodies over a
size limit with 413, before anything parses them."""

from __future__ import annotations

import json
import secrets
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class BodySizeLimit:
    """Checks the bearer token (when one is set) before reading anything, then Content-Length, then counts
    the bytes actually received (chunked bodies too). The endpoints check the token again."""

    def __init__(self, app: ASGIApp, max_bytes: int, token: bytes | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        if self.token is not None and scope.get("path") not in OPEN_PATHS and not self._bearer_ok(headers):
            await self._refuse(send, 401, "unauthorised", "a valid bearer token is required")
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, 413, "too_large", f"request body exceeds {self.max_bytes} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body: bytes = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._refuse(send, 413, "too_large", f"request body exceeds {self.max_bytes} bytes")
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _bearer_ok(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and secrets.compare_digest(given.strip(), self.token or b"")

    @staticmethod
    async def _refuse(send: Send, status: int, error: str, reason: str) -> None:
        payload: dict[str, Any] = {"error": error, "field": None, "reason": reason}
        body = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
